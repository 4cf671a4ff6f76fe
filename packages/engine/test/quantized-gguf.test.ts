/**
 * A quantized GGUF model on the CPU backend runs exactly the f32 model of its dequantized weights.
 *
 * Why bit for bit: the CPU backend holds a block-quantized buffer decoded to float32 on write
 * (`dequantize`, ggml's own float32 arithmetic, the same function `GgufCheckpoint.readF32` calls),
 * and every op reads those float32 values. So the GGUF run and the run over an f32 safetensors
 * folder holding `readF32` of every tensor feed identical float32 weights to identical kernels in
 * the same order: tokens and logits equal to the bit. Tensors the engine keeps as f32 (a fused
 * q/k/v or gate/up group of mixed block types, routed experts, F16 fallbacks of rows that are not
 * whole blocks) are that same `readF32`. What the GGUF run saves is bytes: the backend accounts
 * for the blocks it keeps at their quantized size.
 */
import { mkdtempSync, readFileSync, readdirSync, existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isQuantDType, dtypeOfGgml } from '@nerva/core';
import { canonicalWeightNames, convertToGguf, GgufCheckpoint, type GgufConvertType, type WeightSlot } from '@nerva/models';
import { afterAll, describe, expect, it } from 'vitest';
import { Engine } from '../src/index.js';
import { writeDequantizedFolder } from './dequantized-folder.js';
import { MODELS, nonEmpty } from './fixtures.js';

const TYPES: GgufConvertType[] = ['Q8_0', 'Q4_0', 'Q4_K', 'Q6_K', 'Q4_K_M', 'Q3_K_M', 'Q5_K_M', 'IQ4_XS'];
/** Greedy tokens a case: the runs are compared with each other, not with the reference's 24. */
const NEW_TOKENS = 16;
const names = nonEmpty(
  readdirSync(MODELS).filter((d) => existsSync(join(MODELS, d, 'config.json'))),
  'fixture models',
);
const tmp = mkdtempSync(join(tmpdir(), 'nerva-qgguf-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

interface Case {
  prompt_ids: number[];
}

interface Run {
  tokens: number[][];
  /** Per case: the last prompt position's logits, then each generated position's. */
  logits: Float32Array[][];
  weightBytes: number;
  format: ReturnType<Engine['memoryReport']>['weights']['format'];
  notes: readonly string[];
}

async function greedy(model: string, cases: Case[]): Promise<Run> {
  const engine = await Engine.create({ model, backend: 'cpu' });
  try {
    const tokens: number[][] = [];
    const logits: Float32Array[][] = [];
    for (const c of cases) {
      const o = await engine.submit(c.prompt_ids, { temperature: 0, maxTokens: NEW_TOKENS, ignoreEos: true, returnPromptLogits: true, returnStepLogits: true })
        .done;
      tokens.push(o.tokenIds);
      logits.push([o.promptLogits!, ...o.stepLogits!]);
    }
    const w = engine.memoryReport().weights;
    return { tokens, logits, weightBytes: w.totalBytes, format: w.format, notes: engine.notes };
  } finally {
    engine.dispose();
  }
}

const bytes = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
const quantType = (t: string | undefined): boolean => t !== undefined && isQuantDType(dtypeOfGgml(t as never));

/**
 * The weight bytes a backend that takes every block type should hold for `ck`, by the rule the
 * engine states: a matrix keeps its blocks when every matrix sharing its buffer (q/k/v, gate/up)
 * has its type; routed experts, norms, biases and float tensors are f32 on the CPU backend. Also
 * the bytes kept in blocks.
 */
function expectedWeightBytes(ck: GgufCheckpoint): { total: number; blocks: number; tails: number } {
  const spec = ck.spec;
  let total = (spec.headDim / 2) * 4; // rope inverse frequencies
  let blocks = 0;
  let tails = 0;
  const f32 = (s: WeightSlot) => (total += s.shape.reduce((a, b) => a * b, 1) * 4);
  const held = (s: WeightSlot, group: readonly WeightSlot[]) => {
    const t = ck.info(s.name);
    if (quantType(t.ggmlType) && group.every((g) => ck.info(g.name).ggmlType === t.ggmlType)) {
      total += t.rawByteLength;
      blocks += t.rawByteLength;
    } else f32(s);
  };
  const w = canonicalWeightNames(spec);
  held(w.embed, []);
  if (!w.tiedLmHead) held(w.lmHead, []);
  f32(w.finalNorm);
  for (const l of w.layers) {
    for (const s of [l.inputNorm, l.postAttentionNorm, l.qNorm, l.kNorm, l.qBias, l.kBias, l.vBias, l.oBias]) if (s) f32(s);
    // q/k/v: one buffer of one block type, or q and k in theirs with a v of another type apart
    // (weightTail), else float32.
    const [tq, tk, tv] = [l.q, l.k, l.v].map((s) => ck.info(s.name).ggmlType);
    if (quantType(tq) && tq === tk && quantType(tv) && tv !== tq) {
      tails++;
      for (const s of [l.q, l.k]) held(s, [l.q, l.k]);
      held(l.v, []);
    } else for (const s of [l.q, l.k, l.v]) held(s, [l.q, l.k, l.v]);
    held(l.o, []);
    if (l.mlp.kind === 'dense') {
      held(l.mlp.gate, [l.mlp.gate, l.mlp.up]);
      held(l.mlp.up, [l.mlp.gate, l.mlp.up]);
      held(l.mlp.down, []);
    } else {
      f32(l.mlp.router);
      for (const e of l.mlp.experts) for (const s of [e.gate, e.up, e.down]) f32(s);
    }
  }
  return { total, blocks, tails };
}

describe.each(names)('%s: quantized GGUF on the CPU backend', (name) => {
  const dir = join(MODELS, name);
  const cases = (JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: Case[] }).cases;
  let original: Run | undefined;

  it.each(TYPES)('%s: tokens and logits equal the dequantized f32 run bit for bit; weights held at their quantized size', async (type) => {
    expect(cases.length).toBeGreaterThan(0);
    original ??= await greedy(dir, cases);
    const gguf = join(tmp, `${name}-${type}.gguf`);
    const deq = join(tmp, `${name}-${type}-f32`);
    await convertToGguf({ source: dir, out: gguf, type });
    await writeDequantizedFolder(gguf, dir, deq);
    const ck = await GgufCheckpoint.open(gguf);
    let want: { total: number; blocks: number; tails: number };
    const types: Record<string, number> = {};
    try {
      want = expectedWeightBytes(ck);
      for (const n of ck.names()) types[ck.info(n).ggmlType] = (types[ck.info(n).ggmlType] ?? 0) + 1;
    } finally {
      await ck.close();
    }

    const q = await greedy(gguf, cases);
    const f = await greedy(deq, cases);
    expect(q.tokens).toEqual(f.tokens);
    for (let i = 0; i < cases.length; i++) {
      expect(f.logits[i]).toHaveLength(NEW_TOKENS + 1);
      expect(q.logits[i]).toHaveLength(NEW_TOKENS + 1);
      for (let k = 0; k < f.logits[i].length; k++) expect(bytes(q.logits[i][k]).equals(bytes(f.logits[i][k])), `case ${i} position ${k}`).toBe(true);
    }
    // The check has teeth: quantization moved the logits away from the original model's.
    expect(bytes(q.logits[0][0]).equals(bytes(original.logits[0][0]))).toBe(false);

    // The memory report counts the blocks at their size: the saving is real on the backend's accounting.
    expect(q.weightBytes).toBe(want.total);
    expect(f.weightBytes).toBeGreaterThan(q.weightBytes);
    expect(want.blocks).toBeGreaterThan(0);
    // Q4_K_M keeps v in Q6_K beside Q4_K q and k in some layers: those run with v apart (weightTail).
    if (type === 'Q4_K_M' && name === 'tiny-shakespeare-qwen3') expect(want.tails).toBeGreaterThan(0);
    expect(q.format).toMatchObject({ file: 'gguf', exact: false, types });
    const stored = q.format!.storedBytes;
    expect(Object.values(stored).reduce((a, b) => a + b, 0)).toBe(q.weightBytes);
    expect(Object.entries(stored).filter(([d]) => isQuantDType(d)).reduce((a, [, b]) => a + b, 0)).toBe(want.blocks);
    expect(q.notes.some((n) => n.startsWith('quantized weights'))).toBe(true);
    expect(f.format).toMatchObject({ file: 'safetensors', exact: true, types: { F32: expect.any(Number) } });
    expect(f.notes.some((n) => n.startsWith('quantized weights'))).toBe(false);
  });
});
