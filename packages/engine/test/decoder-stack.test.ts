import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DeviceBackend } from '@nerva/core';
import { Engine, type EngineOptions } from '../src/index.js';
import { keyRangeOf } from '../src/decode-graphs.js';
import { DEFAULT_MODEL } from './fixtures.js';
import { passes, recordingBackend, type Recorded } from './recording-backend.js';

const PROMPTS = ['ROMEO:', 'First Citizen:\nBefore we proceed', 'KING HENRY'];
const greedy = { temperature: 0, maxTokens: 12, ignoreEos: true };

interface Variant {
  engine: Engine;
  calls: Recorded[];
}

async function variant(opts: Partial<EngineOptions>, withStack: boolean): Promise<Variant> {
  const { backend, calls } = recordingBackend(withStack ? [] : ['decoder_layers']);
  return { engine: await Engine.create({ model: DEFAULT_MODEL, backend, ...opts }), calls };
}

const stackCalls = (v: Variant) => v.calls.filter((c) => c.op === 'decoder_layers').length;

async function tokens(v: Variant, prompts: string[]): Promise<number[][]> {
  v.calls.length = 0;
  const outs = await Promise.all(prompts.map((p) => v.engine.submit(p, greedy).done));
  return outs.map((o) => o.tokenIds);
}

describe('decode through decoder_layers matches the per-layer fused path', () => {
  let stack: Variant;
  let perLayer: Variant;
  let stackNoGraph: Variant;
  let profiled: Variant;
  beforeAll(async () => {
    stack = await variant({}, true);
    perLayer = await variant({}, false);
    stackNoGraph = await variant({ useGraphs: false }, true);
    profiled = await variant({ profile: true }, true);
  });
  afterAll(() => {
    for (const v of [stack, perLayer, stackNoGraph, profiled]) v?.engine.dispose();
  });

  it.each([
    ['batch 1', PROMPTS.slice(0, 1)],
    ['batch 3', PROMPTS],
  ])('gives the same greedy tokens (%s), with and without graph capture', async (_name, prompts) => {
    const want = await tokens(perLayer, prompts);
    expect(stackCalls(perLayer)).toBe(0);
    expect(want.every((t) => t.length === greedy.maxTokens)).toBe(true);
    // A captured decode step calls the op once, at capture; without graphs, once per step.
    expect(await tokens(stack, prompts)).toEqual(want);
    expect(stackCalls(stack)).toBeGreaterThan(0);
    expect(await tokens(stackNoGraph, prompts)).toEqual(want);
    expect(stackCalls(stackNoGraph)).toBeGreaterThanOrEqual(greedy.maxTokens - 1);
  });

  it('keeps the per-layer ops while profiling, so time still splits into buckets', async () => {
    const want = await tokens(perLayer, PROMPTS);
    expect(await tokens(profiled, PROMPTS)).toEqual(want);
    expect(stackCalls(profiled)).toBe(0);
    expect(profiled.calls.some((c) => c.op === 'fused_matmul')).toBe(true);
  });

  it('setProfiling turns op timing on and off at run time: eager per-layer steps, each step\'s ops by class', async () => {
    const want = await tokens(perLayer, PROMPTS);
    stack.engine.setProfiling(true);
    try {
      expect(await tokens(stack, PROMPTS)).toEqual(want);
      // Neither the stack op nor a replayed graph while profiling: every step is profiled.
      expect(stackCalls(stack)).toBe(0);
      const steps = stack.engine.takeProfiles();
      expect(steps.length).toBeGreaterThanOrEqual(greedy.maxTokens);
      expect(stack.engine.takeProfiles()).toEqual([]);
      const first = steps[0];
      expect(first.rows).toBeGreaterThan(PROMPTS.length);
      expect(first.deviceMs).toBeGreaterThanOrEqual(0);
      expect(Object.keys(first.ops)).toEqual(expect.arrayContaining(['gemm_qkv', 'gemm_o', 'gemm_gate_up', 'gemm_down', 'lm_head', 'attention', 'rmsnorm']));
      const opSum = Object.values(first.ops).reduce((a, b) => a + b, 0);
      const bucketSum = Object.values(first.buckets).reduce((a, b) => a + b, 0);
      expect(opSum).toBeCloseTo(bucketSum, 6);
    } finally {
      stack.engine.setProfiling(false);
    }
    expect(await tokens(stack, PROMPTS)).toEqual(want);
    expect(stack.engine.takeProfiles()).toEqual([]);
    // Off again, decode steps take the stack op again (without graphs: once per step).
    stackNoGraph.engine.setProfiling(true);
    stackNoGraph.engine.setProfiling(false);
    expect(await tokens(stackNoGraph, PROMPTS)).toEqual(want);
    expect(stackCalls(stackNoGraph)).toBeGreaterThanOrEqual(greedy.maxTokens - 1);
  });

  it('falls back to the per-layer path when a pass mixes a prompt chunk with a decode row', async () => {
    const want = (await tokens(perLayer, [PROMPTS[0]]))[0].slice(0, 6);
    stackNoGraph.calls.length = 0;
    const first = stackNoGraph.engine.submit(PROMPTS[0], { ...greedy, maxTokens: 6 });
    let second: Promise<{ tokenIds: number[] }> | undefined;
    for await (const ev of first.events) {
      // Submitted once the first request has its first token, so the next pass holds the
      // second prompt and the first request's decode row.
      if (ev.index === 0) second = stackNoGraph.engine.submit('O, what', { ...greedy, maxTokens: 3 }).done;
    }
    expect((await first.done).tokenIds).toEqual(want);
    expect((await second!).tokenIds).toHaveLength(3);
    const shapes = passes(stackNoGraph.calls).map((p) => ({ rows: p[0].rows, stack: p.some((c) => c.op === 'decoder_layers') }));
    const promptLen = stackNoGraph.engine.encode('O, what').length;
    expect(promptLen).toBeGreaterThan(1);
    expect(shapes).toContainEqual({ rows: promptLen + 1, stack: false });
    // Once both only decode, they share the op again.
    expect(shapes).toContainEqual({ rows: 2, stack: true });
  });
});

describe('decode graphs by key bound (capabilities.shortContextKeys, longContextKeys)', () => {
  it('names a replay\'s key range from the rows\' computed tokens and its first and last step', () => {
    const caps = { shortContextKeys: 1024, longContextKeys: 8192 };
    // A row at 1000 computed tokens: step 23 has 1024 keys, step 24 one past the bound.
    expect(keyRangeOf(caps, [1000], 0, 23)).toBe('short');
    expect(keyRangeOf(caps, [1000], 0, 24)).toBeUndefined();
    // A row at 8190: its step 1 has 8192 keys (the floor), its step 0 one short of it.
    expect(keyRangeOf(caps, [8190], 1, 4)).toBe('long');
    expect(keyRangeOf(caps, [8190], 0, 4)).toBeUndefined();
    // Every row must qualify; a backend without the capabilities names none.
    expect(keyRangeOf(caps, [9000, 100], 0, 0)).toBeUndefined();
    expect(keyRangeOf({}, [10], 0, 0)).toBeUndefined();
    expect(keyRangeOf({ longContextKeys: 8192 }, [20000], 0, 3)).toBe('long');
  });

  const params = { temperature: 0, maxTokens: 30, ignoreEos: true };
  const prompt = 'ROMEO:';

  /**
   * The prompt decoded greedily on an engine whose backend claims `caps` and on a plain one:
   * their tokens, the claiming engine's graph keys and decoder_layers calls, and the plain one's.
   */
  async function decodeBoth(caps: Partial<DeviceBackend['capabilities']>) {
    const { backend, calls } = recordingBackend([], caps);
    const plain = recordingBackend([]);
    const e = await Engine.create({ model: DEFAULT_MODEL, backend });
    const ref = await Engine.create({ model: DEFAULT_MODEL, backend: plain.backend });
    try {
      const promptLen = e.tokenizer!.encode(prompt).length;
      const out = await e.submit(prompt, params).done;
      const want = await ref.submit(prompt, params).done;
      const stack = (rec: Recorded[]) => rec.filter((c) => c.op === 'decoder_layers');
      return { promptLen, out, want, keys: Object.keys(e.graphNodes()), refKeys: Object.keys(ref.graphNodes()), stack: stack(calls), refStack: stack(plain.calls) };
    } finally {
      e.dispose();
      ref.dispose();
      backend.dispose();
      plain.backend.dispose();
    }
  }

  it('captures a graph for steps within the bound, with it as maxKeys, and another past it; same tokens', async () => {
    const bound = 24;
    const r = await decodeBoth({ shortContextKeys: bound });
    expect(r.promptLen + 2).toBeLessThanOrEqual(bound); // the first decode steps fall within it
    expect(r.out.tokenIds).toEqual(r.want.tokenIds);
    // Batch-size bucket 1, once within the bound ("1s") and once past it ("1").
    expect(r.keys.sort()).toEqual(['1', '1s']);
    expect(r.refKeys).toEqual(['1']);
    const bounded = r.stack.filter((c) => c.args.maxKeys !== undefined);
    // Each graph's op is recorded once, at its capture; only the short graph's carries maxKeys.
    expect(bounded.map((c) => c.args.maxKeys)).toEqual([bound]);
    expect(r.stack.length - bounded.length).toBe(1);
    expect(r.refStack.some((c) => c.args.maxKeys !== undefined)).toBe(false);
  });

  it('captures a graph for steps whose row has at least the long bound, with it as minKeys; same tokens', async () => {
    const floor = 20;
    const r = await decodeBoth({ longContextKeys: floor });
    expect(r.promptLen + 2).toBeLessThan(floor); // the first decode steps fall below it
    expect(r.promptLen + params.maxTokens).toBeGreaterThan(floor + 8); // the last ones past it
    expect(r.out.tokenIds).toEqual(r.want.tokenIds);
    // Batch-size bucket 1, below the floor ("1") and from it on ("1l"): both a replay of one
    // step and one of several (run-ahead), each starting where its row already has the floor.
    expect(r.keys).toContain('1');
    expect(r.keys).toContain('1l');
    expect(r.keys.every((k) => /^1l?(x\d+)?$/.test(k))).toBe(true);
    expect(r.refKeys.every((k) => !k.includes('l'))).toBe(true);
    const floored = r.stack.filter((c) => c.args.minKeys !== undefined);
    // Each long graph's op carries the floor, no other op does, and none carries maxKeys.
    expect(floored.length).toBe(r.keys.filter((k) => k.startsWith('1l')).length);
    expect(floored.every((c) => c.args.minKeys === floor && c.args.maxKeys === undefined)).toBe(true);
    expect(r.stack.length - floored.length).toBe(r.keys.filter((k) => !k.startsWith('1l')).length);
    expect(r.refStack.some((c) => c.args.minKeys !== undefined)).toBe(false);
  });
});
