import { createCpuBackend } from '@nerva/cpu-backend';
import type { DeviceBackend, GraphHandle, OpArgs } from '@nerva/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, type EngineOptions } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

// The CPU backend runs a replay when it is issued, so a step enqueued ahead is computed at once;
// what these tests check is the engine's side: which steps it enqueues ahead, which it adopts or
// drops, and that the tokens are those of an engine that never runs ahead.

interface Counted {
  engine: Engine;
  counts: { replays: number; eventSyncs: number; records: number; badIntervals: number; steps: number };
}

async function counted(runAhead: boolean | undefined, extra: Partial<EngineOptions> = {}): Promise<Counted> {
  const inner = createCpuBackend();
  const counts = { replays: 0, eventSyncs: 0, records: 0, badIntervals: 0, steps: 0 };
  // When each event was last recorded: a step's time is measured between two events recorded in
  // that order, neither recorded again since (a start re-recorded for a later step would not be).
  let seq = 0;
  const recordedAt = new Map<unknown, number>();
  const stepsOf = new Map<GraphHandle, number>();
  let capturing = 0;
  const backend = new Proxy(inner, {
    get(target, prop, receiver) {
      const v = Reflect.get(target, prop, receiver) as unknown;
      if (typeof v !== 'function') return v;
      const f = (v as (...x: unknown[]) => unknown).bind(target);
      // Steps a replay runs: the advances its capture recorded (one a step: op advance_positions,
      // or op sample's advance where the backend folds it).
      if (prop === 'replay') return (...a: unknown[]) => (counts.replays++, (counts.steps += stepsOf.get(a[0] as GraphHandle)!), f(...a));
      if (prop === 'beginCapture') return (...a: unknown[]) => ((capturing = 0), f(...a));
      if (prop === 'run')
        return (...a: unknown[]) => ((a[0] === 'advance_positions' || (a[0] === 'sample' && (a[1] as OpArgs<'sample'>).advance)) && capturing++, f(...a));
      if (prop === 'endCapture') return (...a: unknown[]) => {
        const g = f(...a) as GraphHandle;
        stepsOf.set(g, capturing);
        return g;
      };
      if (prop === 'synchronizeEvent') return (...a: unknown[]) => (counts.eventSyncs++, f(...a));
      if (prop === 'record') return (...a: unknown[]) => (counts.records++, recordedAt.set(a[0], ++seq), f(...a));
      if (prop === 'elapsedMs')
        return (...a: unknown[]) => {
          const s0 = recordedAt.get(a[0]);
          const s1 = recordedAt.get(a[1]);
          if (s0 === undefined || s1 === undefined || s0 >= s1) counts.badIntervals++;
          return f(...a);
        };
      return f;
    },
  }) as DeviceBackend;
  return { engine: await Engine.create({ model: DEFAULT_MODEL, backend, ...(runAhead !== undefined ? { runAhead } : {}), ...extra }), counts };
}

const greedy = (maxTokens: number, extra: Record<string, unknown> = {}) => ({ temperature: 0, maxTokens, ignoreEos: true, ...extra });
const PROMPTS = ['ROMEO:', 'First Citizen:\nBefore we proceed', 'KING HENRY'];

/**
 * An engine running ahead with `extra` and one that does not, made before the suite's tests and
 * disposed after them; reset() zeroes both engines' counts.
 */
function enginePair(extra: Partial<EngineOptions>): { ahead: Counted; plain: Counted; reset(): void } {
  const p = {
    reset() {
      for (const c of [p.ahead, p.plain]) for (const k of Object.keys(c.counts) as (keyof Counted['counts'])[]) c.counts[k] = 0;
    },
  } as { ahead: Counted; plain: Counted; reset(): void };
  beforeAll(async () => {
    p.ahead = await counted(true, extra);
    p.plain = await counted(false);
  });
  afterAll(() => {
    p.ahead?.engine.dispose();
    p.plain?.engine.dispose();
  });
  return p;
}

describe('run-ahead decode (EngineOptions.runAhead)', () => {
  // One step a replay (replays of several: the suite below).
  const s = enginePair({ runAheadSteps: 1 });
  const reset = s.reset;

  it('adopts the steps it enqueued ahead and decodes the same tokens', async () => {
    for (const prompts of [PROMPTS.slice(0, 1), PROMPTS]) {
      reset();
      const want = await Promise.all(prompts.map((p) => s.plain.engine.submit(p, greedy(40)).done));
      const got = await Promise.all(prompts.map((p) => s.ahead.engine.submit(p, greedy(40)).done));
      expect(got.map((o) => o.tokenIds)).toEqual(want.map((o) => o.tokenIds));
      expect(want.every((o) => o.tokenIds.length === 40)).toBe(true);
      // Requests that run to maxTokens waste no step: as many replays as without run-ahead...
      expect(s.ahead.counts.replays).toBe(s.plain.counts.replays);
      expect(s.plain.counts.eventSyncs).toBe(0);
      // ...and every decode step but the last was enqueued during the step before, those that
      // start a new KV block included (the block is reserved a step early).
      // (Without the reservation a step whose next position starts a block was not: 36 and 34 of 39.)
      expect(s.ahead.counts.eventSyncs).toBe(s.plain.counts.replays - 1);
      // A step enqueued ahead starts at the end event of the step before it: one event record
      // instead of two (a timed record between two graphs holds the GPU), and every step's time
      // is still taken between two events recorded in order.
      expect(s.ahead.counts.records).toBe(s.plain.counts.records - s.ahead.counts.eventSyncs);
      expect(s.ahead.counts.badIntervals).toBe(0);
      expect(s.plain.counts.badIntervals).toBe(0);
    }
  });

  it('drops the step ahead of a request that stops on a token; the next request is unaffected', async () => {
    const prompt = PROMPTS[1];
    const base = await s.plain.engine.submit(prompt, greedy(40)).done;
    const promptLen = base.promptIds.length;
    // An output index k whose token first appears there, computed at a position whose next one
    // stays in the same KV block (16 positions a block), so a step was enqueued ahead of it.
    const k = base.tokenIds.findIndex((t, i) => i >= 5 && base.tokenIds.indexOf(t) === i && (promptLen + i) % 16 !== 0);
    expect(k).toBeGreaterThan(0);
    const stopId = base.tokenIds[k];
    reset();
    const want = await s.plain.engine.submit(prompt, greedy(40, { stopTokenIds: [stopId] })).done;
    const got = await s.ahead.engine.submit(prompt, greedy(40, { stopTokenIds: [stopId] })).done;
    expect(want.tokenIds).toEqual(base.tokenIds.slice(0, k + 1));
    expect(got.tokenIds).toEqual(want.tokenIds);
    expect(got.finishReason).toBe('stop');
    // One step ran ahead past the stop and was dropped.
    expect(s.ahead.counts.replays).toBe(s.plain.counts.replays + 1);
    // The device state it advanced (ring, positions, RNG) does not leak into what follows.
    const next = await Promise.all([s.plain.engine.submit(PROMPTS[2], greedy(24)).done, s.ahead.engine.submit(PROMPTS[2], greedy(24)).done]);
    expect(next[1].tokenIds).toEqual(next[0].tokenIds);
  });

  it('seeded sampling after a dropped step draws what it draws without run-ahead', async () => {
    const sampled = { temperature: 0.9, topP: 0.95, seed: 1234, maxTokens: 30, ignoreEos: true };
    const base = await s.plain.engine.submit(PROMPTS[0], greedy(20)).done;
    const stop = { ...greedy(20), stopTokenIds: [base.tokenIds[9]] };
    await Promise.all([s.plain.engine.submit(PROMPTS[0], stop).done, s.ahead.engine.submit(PROMPTS[0], stop).done]);
    const [want, got] = await Promise.all([s.plain.engine.submit(PROMPTS[1], sampled).done, s.ahead.engine.submit(PROMPTS[1], sampled).done]);
    expect(got.tokenIds).toEqual(want.tokenIds);
  });

  it('a request arriving mid-decode joins the batch with the same tokens', async () => {
    const alone = await Promise.all(PROMPTS.map((p) => s.plain.engine.submit(p, greedy(30)).done));
    const first = s.ahead.engine.submit(PROMPTS[0], greedy(30));
    const later: Promise<number[]>[] = [];
    let seen = 0;
    for await (const ev of first.events) {
      if (++seen === 7) for (const p of PROMPTS.slice(1)) later.push(s.ahead.engine.submit(p, greedy(30)).done.then((o) => o.tokenIds));
      expect(ev.token).toBe(alone[0].tokenIds[ev.index]);
    }
    expect(await Promise.all(later)).toEqual(alone.slice(1).map((o) => o.tokenIds));
  });

  it('an abort while a step is ahead leaves the engine consistent', async () => {
    const want = await s.plain.engine.submit(PROMPTS[2], greedy(20)).done;
    const h = s.ahead.engine.submit(PROMPTS[0], greedy(60));
    let n = 0;
    for await (const ev of h.events) {
      void ev;
      if (++n === 9) h.abort();
    }
    const out = await h.done;
    expect(out.finishReason).toBe('abort');
    expect((await s.ahead.engine.submit(PROMPTS[2], greedy(20)).done).tokenIds).toEqual(want.tokenIds);
  });

  it('keeps running ahead while a wide batch crosses into new blocks (a row does at nearly every step)', async () => {
    // 24 rows at staggered positions: some row starts a new KV block at most steps. Every decode
    // step but the first (issued by the host) and those near the rows' common last token is
    // enqueued ahead (none was before each step issued by the host reserved its rows' next blocks).
    const prompts = Array.from({ length: 24 }, (_, i) => Array.from({ length: 3 + i }, (_, j) => 1 + ((i * 31 + j * 7) % 400)));
    const want = await Promise.all(prompts.map((p) => s.plain.engine.submit(p, greedy(24)).done));
    const steps = { decode: 0, ahead: 0 };
    const off = s.ahead.engine.onStep((g) => {
      if (g.promptTokens > 0) return;
      steps.decode++;
      if (g.enqueuedAhead) steps.ahead++;
    });
    const got = await Promise.all(prompts.map((p) => s.ahead.engine.submit(p, greedy(24)).done));
    off();
    expect(got.map((o) => o.tokenIds)).toEqual(want.map((o) => o.tokenIds));
    expect(steps.decode).toBeGreaterThanOrEqual(20);
    expect(steps.ahead).toBeGreaterThanOrEqual(steps.decode - 4);
  });

  it('keeps running ahead past rows that finish: a finished row stays a pad row in its place until the bucket shrinks', async () => {
    // 16 rows ending one a step (maxTokens 8..23), half of them sampled with seeds (their
    // parameters must follow their places). Compacting at every finish made each step after one
    // a step the host issued (15 of them); with holes only the first decode step and the steps
    // where the live rows fit a smaller bucket (16 -> 8 -> 4 -> 2 -> 1) are.
    const prompts = Array.from({ length: 16 }, (_, i) => Array.from({ length: 4 + (i % 5) }, (_, j) => 1 + ((i * 37 + j * 11) % 400)));
    const params = (i: number) => (i % 2 ? greedy(8 + i) : { temperature: 0.8, seed: 100 + i, maxTokens: 8 + i, ignoreEos: true });
    const want = await Promise.all(prompts.map((p, i) => s.plain.engine.submit(p, params(i)).done));
    const steps = { decode: 0, ahead: 0, dropped: -1, dropped0: -1 };
    const off = s.ahead.engine.onStep((g) => {
      if (steps.dropped0 < 0) steps.dropped0 = g.droppedSteps;
      steps.dropped = g.droppedSteps;
      if (g.promptTokens > 0) return;
      steps.decode++;
      if (g.enqueuedAhead) steps.ahead++;
    });
    const got = await Promise.all(prompts.map((p, i) => s.ahead.engine.submit(p, params(i)).done));
    off();
    expect(got.map((o) => o.tokenIds)).toEqual(want.map((o) => o.tokenIds));
    expect(got.map((o) => o.tokenIds.length)).toEqual(prompts.map((_, i) => 8 + i));
    expect(steps.decode).toBeGreaterThanOrEqual(22);
    expect(steps.decode - steps.ahead).toBeLessThanOrEqual(6);
    // A finish known ahead (maxTokens) drops nothing.
    expect(steps.dropped).toBe(steps.dropped0);
  });

  it('a row that stops on a token mid-batch (not known ahead) drops the steps ahead; the rows in place decode on', async () => {
    const prompts = Array.from({ length: 6 }, (_, i) => Array.from({ length: 5 + i }, (_, j) => 1 + ((i * 53 + j * 13) % 400)));
    const base = await s.plain.engine.submit(prompts[2], greedy(30)).done;
    const params = (i: number) => (i === 2 ? greedy(30, { stopTokenIds: [base.tokenIds[9]] }) : greedy(12 + 3 * i));
    const want = await Promise.all(prompts.map((p, i) => s.plain.engine.submit(p, params(i)).done));
    const got = await Promise.all(prompts.map((p, i) => s.ahead.engine.submit(p, params(i)).done));
    expect(got.map((o) => o.tokenIds)).toEqual(want.map((o) => o.tokenIds));
    expect(got[2].finishReason).toBe('stop');
    expect(got[2].tokenIds.length).toBeLessThanOrEqual(10);
  });

  it('is off by default where the host computes (the CPU backend: nothing to overlap)', async () => {
    const c = await counted(undefined);
    try {
      expect(c.engine.runAhead).toBe(false);
      await c.engine.submit(PROMPTS[0], greedy(20)).done;
      expect(c.counts.eventSyncs).toBe(0);
    } finally {
      c.engine.dispose();
    }
  });
});

describe('replays of several decode steps (EngineOptions.runAheadSteps)', () => {
  // StepSignals.droppedSteps as of the last step.
  let droppedNow = -1;
  const watch = (e: Engine) => e.onStep((s) => (droppedNow = s.droppedSteps));
  // runAheadMs Infinity: four steps a replay whatever the CPU's step time.
  const s = enginePair({ runAheadSteps: 4, runAheadMs: Infinity });
  const reset = s.reset;

  it('runs four steps a replay, computes each step once and decodes the same tokens', async () => {
    // StepSignals.enqueuedAhead: steps the device had before the host scheduled them.
    const ahead = { plain: 0, ahead: 0, steps: 0 };
    const offs = [
      s.plain.engine.onStep((g) => (ahead.plain += g.enqueuedAhead ? 1 : 0)),
      s.ahead.engine.onStep((g) => {
        ahead.ahead += g.enqueuedAhead ? 1 : 0;
        ahead.steps++;
      }),
    ];
    for (const prompts of [PROMPTS.slice(0, 1), PROMPTS]) {
      reset();
      const sampled = { temperature: 0.8, topK: 40, seed: 77, maxTokens: 40, ignoreEos: true };
      const want = await Promise.all(prompts.map((p, i) => s.plain.engine.submit(p, i === 1 ? sampled : greedy(40)).done));
      const got = await Promise.all(prompts.map((p, i) => s.ahead.engine.submit(p, i === 1 ? sampled : greedy(40)).done));
      expect(got.map((o) => o.tokenIds)).toEqual(want.map((o) => o.tokenIds));
      // Every decode step computed once (the requests run to maxTokens: none is dropped)...
      expect(s.ahead.counts.steps).toBe(s.plain.counts.replays);
      // ...in fewer replays: 4-step ones while no row nears its last token, one-step ones after.
      expect(s.ahead.counts.replays).toBeLessThan(s.plain.counts.replays / 2);
      expect(s.ahead.counts.badIntervals).toBe(0);
      // A step's device time is its replay's over its steps: positive, finite, in every token's ledger.
      for (const o of got) expect(o.ledger.all().every((r) => (r.deviceActiveMs ?? 0) > 0 && Number.isFinite(r.deviceActiveMs))).toBe(true);
    }
    for (const off of offs) off();
    expect(ahead.plain).toBe(0);
    // Most decode steps came from a replay enqueued ahead; prompt steps and the first decode step never do.
    expect(ahead.ahead).toBeGreaterThan(ahead.steps / 2);
    expect(ahead.ahead).toBeLessThan(ahead.steps);
    // The 4-step graph is the step's graph four times over.
    const nodes = s.ahead.engine.graphNodes();
    for (const b of ['1', '4']) expect(nodes[`${b}x4`]).toBe(4 * nodes[b]);
  });

  it('a request arriving mid-decode waits for the steps enqueued: none is dropped, tokens the same', async () => {
    const alone = await Promise.all(PROMPTS.map((p) => s.plain.engine.submit(p, greedy(30)).done));
    const off = watch(s.ahead.engine);
    await s.ahead.engine.submit(PROMPTS[0], greedy(2)).done;
    const start = droppedNow;
    expect(start).toBeGreaterThanOrEqual(0);
    const first = s.ahead.engine.submit(PROMPTS[0], greedy(30));
    const later: Promise<number[]>[] = [];
    let seen = 0;
    for await (const ev of first.events) {
      if (++seen === 9) for (const p of PROMPTS.slice(1)) later.push(s.ahead.engine.submit(p, greedy(30)).done.then((o) => o.tokenIds));
      expect(ev.token).toBe(alone[0].tokenIds[ev.index]);
    }
    expect(await Promise.all(later)).toEqual(alone.slice(1).map((o) => o.tokenIds));
    off();
    expect(droppedNow).toBe(start);
  });

  it('drops the steps enqueued past a stop token (at most 2k - 1) and nothing leaks into the next request', async () => {
    const prompt = PROMPTS[1];
    const base = await s.plain.engine.submit(prompt, greedy(40)).done;
    const k = base.tokenIds.findIndex((t, i) => i >= 12 && base.tokenIds.indexOf(t) === i);
    expect(k).toBeGreaterThan(0);
    const off = watch(s.ahead.engine);
    await s.ahead.engine.submit(PROMPTS[0], greedy(2)).done;
    const start = droppedNow;
    expect(start).toBeGreaterThanOrEqual(0);
    const got = await s.ahead.engine.submit(prompt, greedy(40, { stopTokenIds: [base.tokenIds[k]] })).done;
    expect(got.tokenIds).toEqual(base.tokenIds.slice(0, k + 1));
    expect(got.finishReason).toBe('stop');
    const next = await Promise.all([s.plain.engine.submit(PROMPTS[2], greedy(24)).done, s.ahead.engine.submit(PROMPTS[2], greedy(24)).done]);
    expect(next[1].tokenIds).toEqual(next[0].tokenIds);
    off();
    const n = droppedNow - start;
    expect(n).toBeGreaterThanOrEqual(1);
    expect(n).toBeLessThanOrEqual(7);
  });

  it('runAheadMs bounds the steps a replay runs by the device time they hold', async () => {
    const c = await counted(true, { runAheadSteps: 4, runAheadMs: 0 });
    try {
      reset();
      const want = await s.plain.engine.submit(PROMPTS[0], greedy(24)).done;
      const got = await c.engine.submit(PROMPTS[0], greedy(24)).done;
      expect(got.tokenIds).toEqual(want.tokenIds);
      expect(c.counts.replays).toBeGreaterThan(0);
      // No device time to hold: one step a replay.
      expect(c.counts.steps).toBe(c.counts.replays);
      expect(Object.keys(c.engine.graphNodes()).some((k) => k.includes('x'))).toBe(false);
    } finally {
      c.engine.dispose();
    }
  });

  it('refuses bad runAheadSteps and runAheadMs with a clear error', async () => {
    for (const runAheadSteps of [0, 1.5, 17, '2' as unknown as number])
      await expect(Engine.create({ model: DEFAULT_MODEL, backend: createCpuBackend(), runAheadSteps })).rejects.toThrow(/runAheadSteps must be an integer from 1 to 16/);
    for (const runAheadMs of [-1, Number.NaN, '5' as unknown as number])
      await expect(Engine.create({ model: DEFAULT_MODEL, backend: createCpuBackend(), runAheadMs })).rejects.toThrow(/runAheadMs must be a number of milliseconds/);
  });
});
