import type { Worker } from 'node:worker_threads';
import { createCpuBackend } from '@nerva/cpu-backend';
import type { DeviceBackend } from '@nerva/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, GrammarEngineError, HostSampler, InvalidParamsError, type RequestHandle, type RequestOutcome } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

// Constrained decoding as a token policy of the engine, on the CPU backend (op sample applies the
// masks there): outputs match their grammars, grammar rows batch with free rows without changing
// the free rows' tokens, and the host path (a grammar row that needs the host sampler) samples the
// same tokens as the device path.

const SCHEMA = {
  type: 'object',
  properties: {
    who: { type: 'string', maxLength: 8 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    mood: { enum: ['glad', 'sad', 'mad'] },
  },
  required: ['who', 'age', 'mood'],
  additionalProperties: false,
};

describe('constrained decoding (CPU)', () => {
  let engine: Engine;
  beforeAll(async () => {
    engine = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumSeqs: 8 });
  });
  afterAll(() => engine?.dispose());

  const schemaRequest = (seed: number, extra: object = {}) => engine.submit('ROMEO:', { temperature: 0.9, seed, maxTokens: 48, jsonSchema: SCHEMA, ...extra }).done;
  const free = (prompt: string, seed: number) => engine.submit(prompt, { temperature: 1, seed, maxTokens: 12, ignoreEos: true }).done;

  it('JSON Schema requests stop where the grammar accepts, their text parses and validates; grammar time is in the ledger', async () => {
    for (const seed of [1, 2, 3]) {
      const o = await schemaRequest(seed);
      expect(o.finishReason, o.text).toBe('stop');
      const v = JSON.parse(o.text) as Record<string, unknown>;
      expect(Object.keys(v)).toEqual(['who', 'age', 'mood']);
      expect([...(v.who as string)].length).toBeLessThanOrEqual(8);
      expect(Number.isInteger(v.age) && (v.age as number) >= 0 && (v.age as number) <= 120).toBe(true);
      expect(['glad', 'sad', 'mad']).toContain(v.mood);
      const s = o.ledger.summary();
      // The grammar time on the step's path: with masks on worker threads, the time a step waited
      // for them (0 where a worker finished while the forward ran), so only its presence is certain.
      expect(s.grammar_ms_total).toBeGreaterThanOrEqual(0);
      expect(o.ledger.all().every((r) => r.grammarMs !== undefined && r.grammarMs >= 0)).toBe(true);
    }
  });

  it('on the step loop\'s thread (grammarThreads 0) the ledger carries the masks\' compute time', async () => {
    const local = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumSeqs: 2, grammarThreads: 0 });
    try {
      expect(local.grammarThreads).toBe(0);
      const o = await local.submit('ROMEO:', { temperature: 0.9, seed: 1, maxTokens: 48, jsonSchema: SCHEMA }).done;
      expect(() => JSON.parse(o.text)).not.toThrow();
      expect(o.ledger.summary().grammar_ms_total).toBeGreaterThan(0);
    } finally {
      local.dispose();
    }
  });

  it('EBNF, regex and choice; a request cut by maxTokens ends with length', async () => {
    const ebnf = await engine.submit('ROMEO:', { temperature: 1, seed: 5, maxTokens: 32, grammar: 'root ::= ("yea" | "nay") (", " ("yea" | "nay")){0,2} "."' }).done;
    expect(ebnf.finishReason).toBe('stop');
    expect(ebnf.text).toMatch(/^(yea|nay)(, (yea|nay)){0,2}\.$/);
    const rx = await engine.submit('ROMEO:', { temperature: 1, seed: 6, maxTokens: 32, grammar: { type: 'regex', pattern: '[A-Z][a-z]{2,6} [0-9]{2}' } }).done;
    expect(rx.finishReason).toBe('stop');
    expect(rx.text).toMatch(/^[A-Z][a-z]{2,6} [0-9]{2}$/);
    const choice = await engine.submit('ROMEO:', { temperature: 1, seed: 7, maxTokens: 32, grammar: { type: 'choice', choices: ['Montague', 'Capulet'] } }).done;
    expect(['Montague', 'Capulet']).toContain(choice.text);
    const cut = await engine.submit('ROMEO:', { temperature: 1, seed: 8, maxTokens: 3, grammar: { type: 'regex', pattern: '[a-z ]{40}' } }).done;
    expect(cut.finishReason).toBe('length');
    expect(cut.tokenIds).toHaveLength(3);
    expect(cut.text).toMatch(/^[a-z ]*$/);
  });

  it('grammar requests batched with free ones leave the free ones their tokens alone; each grammar request its own', async () => {
    const prompts = ['KING HENRY', 'O, what a', 'JULIET:\nAy me'];
    const aloneFree: RequestOutcome[] = [];
    for (let i = 0; i < prompts.length; i++) aloneFree.push(await free(prompts[i], 70 + i));
    const aloneGrammar = [await schemaRequest(11), await schemaRequest(12)];
    const together = await Promise.all([schemaRequest(11), ...prompts.map((p, i) => free(p, 70 + i)), schemaRequest(12)]);
    expect(together[0].tokenIds).toEqual(aloneGrammar[0].tokenIds);
    expect(together[4].tokenIds).toEqual(aloneGrammar[1].tokenIds);
    for (let i = 0; i < prompts.length; i++) expect(together[i + 1].tokenIds, prompts[i]).toEqual(aloneFree[i].tokenIds);
  });

  it('a grammar row sampled on the host (it asks for logprobs) takes the tokens the device samples for it', async () => {
    let hostRows = 0;
    const sample = HostSampler.prototype.sample;
    HostSampler.prototype.sample = function (this: HostSampler, ...a: Parameters<HostSampler['sample']>) {
      hostRows++;
      return sample.apply(this, a);
    };
    let device: RequestOutcome;
    try {
      device = await schemaRequest(21);
      expect(hostRows).toBe(0);
    } finally {
      HostSampler.prototype.sample = sample;
    }
    const host = await schemaRequest(21, { logprobs: true, topLogprobs: 3 });
    expect(host.tokenIds).toEqual(device.tokenIds);
    expect(host.text).toBe(device.text);
  });

  it('logit bias: a bias of 100 forces a token, -100 bans the greedy one', async () => {
    const base = await engine.submit('ROMEO:', { temperature: 0, maxTokens: 4, ignoreEos: true }).done;
    const banned = await engine.submit('ROMEO:', { temperature: 0, maxTokens: 4, ignoreEos: true, logitBias: { [base.tokenIds[0]]: -100 } }).done;
    expect(banned.tokenIds[0]).not.toBe(base.tokenIds[0]);
    const forced = await engine.submit('ROMEO:', { temperature: 0.7, seed: 3, maxTokens: 4, ignoreEos: true, logitBias: { '42': 100 } }).done;
    expect(forced.tokenIds).toEqual([42, 42, 42, 42]);
  });

  it('bad grammars and combinations are InvalidParamsError naming the field; the engine runs on', async () => {
    const h = engine.submit('ROMEO:', { grammar: 'root ::= undefined_rule' });
    const events = (async () => {
      for await (const _ of h.events);
    })();
    await expect(events).rejects.toThrow(/Rule "undefined_rule" is not defined/);
    expect((await h.done).finishReason).toBe('abort');
    expect(() => engine.submit('ROMEO:', { grammar: { type: 'nope' } as never })).toThrow(InvalidParamsError);
    expect(() => engine.submit('ROMEO:', { grammar: 'root ::= "a"', jsonSchema: {} })).toThrow(/either grammar or jsonSchema/);
    expect(() => engine.submit('ROMEO:', { grammar: 'root ::= "a"', stop: ['x'] })).toThrow(/stop strings cannot be combined/);
    expect(() => engine.submit('ROMEO:', { grammar: 'root ::= "a"', minTokens: 2 })).toThrow(/min_tokens/);
    expect(() => engine.submit('ROMEO:', { logitBias: { '-1': 3 } })).toThrow(/logit_bias/);
    expect(() => engine.submit('ROMEO:', { logitBias: { '5': 101 } })).toThrow(/logit_bias/);
    const ok = await engine.submit('ROMEO:', { maxTokens: 8, grammar: { type: 'choice', choices: ['aye'] } }).done;
    expect(ok.text).toBe('aye');
  });
});

/** The error a request's event stream ends with (undefined: it ended cleanly). */
async function streamError(h: RequestHandle): Promise<Error | undefined> {
  try {
    for await (const _ of h.events);
  } catch (e) {
    return e as Error;
  }
  return undefined;
}

// Token masks on grammar worker threads (the default where the worker entry is built) against
// masks computed on the step loop's thread (grammarThreads 0), and decode steps with grammar rows
// replaying the captured graph variant with masks (the CPU backend captures graphs) against steps
// run eagerly (useGraphs false): the same tokens, batched or not.
describe('constrained decoding on grammar worker threads (CPU)', () => {
  let pooled: Engine;
  let inThread: Engine;
  let eager: Engine;
  beforeAll(async () => {
    pooled = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumSeqs: 8, grammarThreads: 2 });
    inThread = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumSeqs: 8, grammarThreads: 0 });
    eager = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumSeqs: 8, grammarThreads: 2, useGraphs: false });
  });
  afterAll(() => {
    pooled?.dispose();
    inThread?.dispose();
    eager?.dispose();
  });

  const mixed = (e: Engine) =>
    Promise.all([
      ...[31, 32, 33, 34].map((seed) => e.submit('ROMEO:', { temperature: 0.9, seed, maxTokens: 48, jsonSchema: SCHEMA }).done),
      e.submit('JULIET:', { temperature: 1, seed: 9, maxTokens: 16, ignoreEos: true }).done,
      e.submit('ROMEO:', { temperature: 1, seed: 35, maxTokens: 24, grammar: { type: 'regex', pattern: '[A-Z][a-z]{2,9}( [a-z]{1,7}){1,3}\\.' } }).done,
    ]);

  it('gives the tokens of masks computed on the step loop\'s thread and of eager steps, grammar rows batched with free ones', async () => {
    expect(pooled.grammarThreads).toBe(2);
    expect(inThread.grammarThreads).toBe(0);
    const a = await mixed(pooled);
    const b = await mixed(inThread);
    const c = await mixed(eager);
    for (let i = 0; i < a.length; i++) {
      expect(a[i].tokenIds, `request ${i}`).toEqual(b[i].tokenIds);
      expect(c[i].tokenIds, `request ${i}`).toEqual(b[i].tokenIds);
      expect(a[i].finishReason).toBe(b[i].finishReason);
    }
    // The grammar rows' decode steps replayed graphs: the forward and the sampling with masks, as
    // two graphs ("m" and "m:sample" keys); steps of free rows alone keep the graph without masks.
    const decodeReplays = (o: RequestOutcome) => o.ledger.all().filter((r) => r.phase === 'decode' && r.graphReplays > 0).length;
    for (const o of a) expect(decodeReplays(o)).toBeGreaterThan(0);
    for (const o of c) expect(decodeReplays(o)).toBe(0);
    const keys = Object.keys(pooled.graphNodes());
    expect(keys.some((k) => k.endsWith('m:sample'))).toBe(true);
    expect(keys.some((k) => /^\d+$/.test(k))).toBe(true);
    for (const o of a.slice(0, 4)) if (o.finishReason === 'stop') expect(Object.keys(JSON.parse(o.text) as object)).toEqual(['who', 'age', 'mood']);
    // Every token of a grammar request has its grammar time (the wait for its mask).
    for (const o of a.slice(0, 4)) expect(o.ledger.all().every((r) => r.grammarMs !== undefined && r.grammarMs >= 0)).toBe(true);
  });

  it('run ahead, the next step\'s forward is enqueued before the host reads the tokens (its sampling waits for the masks): the same tokens', async () => {
    const inner = createCpuBackend();
    const counts = { eventSyncs: 0, dropped: 0 };
    const backend = new Proxy(inner, {
      get(target, prop, receiver) {
        const v = Reflect.get(target, prop, receiver) as unknown;
        if (typeof v !== 'function') return v;
        const f = (v as (...x: unknown[]) => unknown).bind(target);
        return prop === 'synchronizeEvent' ? (...x: unknown[]) => (counts.eventSyncs++, f(...x)) : f;
      },
    }) as DeviceBackend;
    const ahead = await Engine.create({ model: DEFAULT_MODEL, backend, maxNumSeqs: 8, grammarThreads: 2, runAhead: true });
    try {
      ahead.onStep((sig) => (counts.dropped = sig.droppedSteps));
      // Grammar rows only: every decode step has one, so any step enqueued ahead is a forward alone.
      const run = (e: Engine) => Promise.all([31, 32, 33].map((seed) => e.submit('ROMEO:', { temperature: 0.9, seed, maxTokens: 48, jsonSchema: SCHEMA }).done));
      const a = await run(ahead);
      const b = await run(inThread);
      for (let i = 0; i < a.length; i++) expect(a[i].tokenIds, `request ${i}`).toEqual(b[i].tokenIds);
      const decodeSteps = Math.max(...a.map((o) => o.tokenIds.length)) - 1;
      // Decode steps adopted a forward enqueued during the step before but where a request ended
      // (the pass changed: the forward enqueued for the old one was dropped).
      expect(counts.eventSyncs).toBeGreaterThanOrEqual(decodeSteps - a.length);
      expect(counts.dropped).toBeLessThanOrEqual(a.length + 1);
    } finally {
      ahead.dispose();
    }
  });

  it('refuses a bad grammarThreads with a clear error before anything loads', async () => {
    for (const grammarThreads of [-1, 1.5, 65, '2' as unknown as number])
      await expect(Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', grammarThreads })).rejects.toThrow(/grammarThreads must be an integer from 0 to 64/);
  });

  it('a bad grammar among good ones fails alone with XGrammar message; the others finish as they would alone', async () => {
    const alone = await pooled.submit('ROMEO:', { temperature: 0.9, seed: 41, maxTokens: 48, jsonSchema: SCHEMA }).done;
    const good = pooled.submit('ROMEO:', { temperature: 0.9, seed: 41, maxTokens: 48, jsonSchema: SCHEMA });
    const bad = pooled.submit('ROMEO:', { temperature: 0.9, seed: 42, maxTokens: 48, grammar: 'root ::= "a" | missing_rule' });
    const free = pooled.submit('JULIET:', { temperature: 1, seed: 9, maxTokens: 16, ignoreEos: true });
    const err = await streamError(bad);
    expect(err).toBeInstanceOf(InvalidParamsError);
    expect(err?.message).toMatch(/Rule "missing_rule" is not defined/);
    const badOut = await bad.done;
    expect(badOut.finishReason).toBe('abort');
    // The outcome says why, for callers that only await `done`.
    expect(badOut.error?.message).toMatch(/Rule "missing_rule" is not defined/);
    expect(badOut.error?.code).toBe(err && (err as { code?: string }).code);
    expect((await good.done).error).toBeUndefined();
    expect((await good.done).tokenIds).toEqual(alone.tokenIds);
    expect((await free.done).tokenIds).toHaveLength(16);
  });

  it('a grammar worker that exits mid-request ends its requests with GrammarEngineError; free requests and later grammars run on', async () => {
    const one = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumSeqs: 8, grammarThreads: 1 });
    try {
      const freeAlone = await one.submit('JULIET:', { temperature: 1, seed: 9, maxTokens: 24, ignoreEos: true }).done;
      // A grammar that cannot end before maxTokens: the request is still running when its worker goes.
      const long = { temperature: 1, seed: 3, maxTokens: 40, grammar: { type: 'regex' as const, pattern: '[a-z ]{60}' } };
      const g = one.submit('ROMEO:', long);
      const free = one.submit('JULIET:', { temperature: 1, seed: 9, maxTokens: 24, ignoreEos: true });
      const it = g.events[Symbol.asyncIterator]();
      await it.next();
      const pool = (one as unknown as { constrained: { pool: { workers: { worker: Worker }[] } } }).constrained.pool;
      await pool.workers[0].worker.terminate();
      let err: unknown;
      try {
        while (!(await it.next()).done);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(GrammarEngineError);
      expect((err as Error).message).toMatch(/grammar worker 0 exited/);
      expect((await g.done).finishReason).toBe('abort');
      expect((await free.done).tokenIds).toEqual(freeAlone.tokenIds);
      const after = await one.submit('ROMEO:', { maxTokens: 8, grammar: { type: 'choice', choices: ['aye'] } }).done;
      expect(after.text).toBe('aye');
    } finally {
      one.dispose();
    }
  });
});
