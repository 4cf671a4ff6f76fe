/** Conformance cases, element-wise and row ops: embedding gather, RMSNorm, SiLU·mul, add, row gather, RoPE, KV append. */
import { step, f32, i32, bf16, floatOut, bf16Out, invFreq, type BufDef, type CaseDef, type CaseTable } from './kit.js';

function embeddingCase(name: string, vocab: number, hidden: number, rows: number, weight: 'f32' | 'bf16', large = false): CaseDef {
  return {
    name,
    large,
    build: (rng) => {
      const ids = Array.from({ length: rows }, () => rng.int(0, vocab));
      ids[0] = vocab - 1; // the last row of the table
      if (rows > 2) ids[rows - 1] = 0;
      if (rows > 3) ids[1] = ids[2]; // a repeat
      const table = rng.normals(vocab * hidden);
      return {
        buffers: { table: weight === 'bf16' ? bf16(table) : f32(table), ids: i32(ids), out: f32(rng.normals(rows * hidden + 3)) },
        steps: [step('embedding', (b) => ({ table: b.table, ids: b.ids, out: b.out, rows, hidden }))],
        outputs: [floatOut('out')],
      };
    },
  };
}

function rmsnormCase(name: string, rows: number, dim: number, residual: boolean, eps: number, xScale = 1, large = false, out: 'f32' | 'bf16' = 'f32'): CaseDef {
  const o = out === 'bf16' ? bf16Out : floatOut;
  return {
    name,
    large,
    activationDtype: out === 'bf16' ? 'bf16' : undefined,
    build: (rng) => {
      const buffers: Record<string, BufDef> = {
        x: f32(rng.normals(rows * dim, xScale)),
        weight: f32(rng.normals(dim, 0.3).map((v) => 1 + v)),
        out: out === 'bf16' ? bf16(rng.normals(rows * dim + 2)) : f32(rng.normals(rows * dim + 2)),
      };
      if (residual) buffers.residual = f32(rng.normals(rows * dim, 2));
      return {
        buffers,
        steps: [
          step('rmsnorm', (b) => ({ x: b.x, weight: b.weight, out: b.out, rows, dim, eps, ...(residual ? { residual: b.residual } : {}) })),
        ],
        outputs: residual ? [o('out'), floatOut('residual')] : [o('out')],
      };
    },
  };
}

function siluMulCase(name: string, rows: number, dim: number, scale: number, out: 'f32' | 'bf16' = 'f32'): CaseDef {
  return {
    name,
    activationDtype: out === 'bf16' ? 'bf16' : undefined,
    build: (rng) => ({
      buffers: { x: f32(rng.normals(rows * 2 * dim, scale)), out: out === 'bf16' ? bf16(rng.normals(rows * dim + 1)) : f32(rng.normals(rows * dim + 1)) },
      steps: [step('silu_mul', (b) => ({ x: b.x, out: b.out, rows, dim }))],
      outputs: [out === 'bf16' ? bf16Out('out') : floatOut('out')],
    }),
  };
}

function addCase(name: string, length: number): CaseDef {
  return {
    name,
    build: (rng) => ({
      buffers: { a: f32(rng.normals(length)), b: f32(rng.normals(length, 3)), out: f32(rng.normals(length + 2)) },
      steps: [step('add', (b) => ({ a: b.a, b: b.b, out: b.out, length }))],
      outputs: [floatOut('out')],
    }),
  };
}

function gatherCase(name: string, xRows: number, n: number, dim: number, skip: number[] = []): CaseDef {
  return {
    name,
    build: (rng) => {
      const idx = Array.from({ length: n }, () => rng.int(0, xRows));
      idx[0] = xRows - 1;
      // A negative index leaves its output row as it was.
      for (const i of skip) idx[i] = -1;
      return {
        buffers: { x: f32(rng.normals(xRows * dim)), rowIdx: i32(idx), out: f32(rng.normals(n * dim + 2)) },
        steps: [step('gather_rows', (b) => ({ x: b.x, rowIdx: b.rowIdx, out: b.out, n, dim }))],
        outputs: [floatOut('out')],
      };
    },
  };
}

interface RopeShape {
  rows: number;
  numHeads: number;
  headDim: number;
  rowStride: number;
  headOffset: number;
  norm: boolean;
  eps?: number;
  maxPos: number;
  base: number;
}

function ropeCase(name: string, s: RopeShape, large = false): CaseDef {
  return {
    name,
    large,
    build: (rng) => {
      const positions = Array.from({ length: s.rows }, () => rng.int(0, s.maxPos));
      positions[0] = 0; // the identity rotation
      if (s.rows > 1) positions[s.rows - 1] = s.maxPos - 1;
      const buffers: Record<string, BufDef> = {
        x: f32(rng.normals(s.rows * s.rowStride, 2)),
        positions: i32(positions),
        invFreq: f32(invFreq(s.headDim, s.base)),
      };
      if (s.norm) buffers.normWeight = f32(rng.normals(s.headDim, 0.3).map((v) => 1 + v));
      return {
        buffers,
        steps: [
          step('rope', (b) => ({
            x: b.x,
            positions: b.positions,
            invFreq: b.invFreq,
            rows: s.rows,
            numHeads: s.numHeads,
            headDim: s.headDim,
            rowStride: s.rowStride,
            headOffset: s.headOffset,
            ...(s.norm ? { normWeight: b.normWeight, eps: s.eps ?? 1e-6 } : {}),
          })),
        ],
        outputs: [floatOut('x')],
      };
    },
  };
}

interface KvShape {
  rows: number;
  numKvHeads: number;
  headDim: number;
  rowStride: number;
  kOffset: number;
  vOffset: number;
  slots: number;
  padding: number;
}

function kvAppendCase(name: string, s: KvShape): CaseDef {
  return {
    name,
    build: (rng) => {
      const w = s.numKvHeads * s.headDim;
      const slots = rng.perm(s.slots).slice(0, s.rows);
      for (let i = 0; i < s.padding; i++) slots[rng.int(0, s.rows)] = -1;
      return {
        buffers: {
          src: f32(rng.normals(s.rows * s.rowStride)),
          // Prefilled, so a backend that writes the wrong slot (or a padding row) is caught.
          kCache: f32(rng.normals(s.slots * w)),
          vCache: f32(rng.normals(s.slots * w)),
          slots: i32(slots),
        },
        steps: [
          step('kv_append', (b) => ({
            src: b.src,
            kCache: b.kCache,
            vCache: b.vCache,
            slots: b.slots,
            rows: s.rows,
            numKvHeads: s.numKvHeads,
            headDim: s.headDim,
            rowStride: s.rowStride,
            kOffset: s.kOffset,
            vOffset: s.vOffset,
          })),
        ],
        outputs: [floatOut('kCache'), floatOut('vCache')],
      };
    },
  };
}

export const elementwiseCases: Pick<CaseTable, 'embedding' | 'rmsnorm' | 'silu_mul' | 'add' | 'gather_rows' | 'rope' | 'kv_append'> = {
  embedding: [
    embeddingCase('vocab 37 x 13, 5 rows', 37, 13, 5, 'f32'),
    embeddingCase('vocab 100 x 64, 1 row', 100, 64, 1, 'f32'),
    embeddingCase('bf16 table 50 x 24, 7 rows', 50, 24, 7, 'bf16'),
    embeddingCase('bf16 table 4099 x 1024, 9 rows', 4099, 1024, 9, 'bf16', true),
  ],
  rmsnorm: [
    rmsnormCase('3 x 17, no residual', 3, 17, false, 1e-6),
    rmsnormCase('4 x 64, residual', 4, 64, true, 1e-5),
    rmsnormCase('1 x 130, residual, large x', 1, 130, true, 1e-6, 30),
    rmsnormCase('2 x 5, tiny x (eps matters)', 2, 5, false, 1e-2, 1e-2),
    rmsnormCase('5 x 4096, residual', 5, 4096, true, 1e-6, 1, true),
    // bf16 outs (capabilities.activationDtypes): the prefill norms before the projections.
    rmsnormCase('bf16 out, 3 x 17', 3, 17, false, 1e-6, 1, false, 'bf16'),
    rmsnormCase('bf16 out, 12 x 4096, residual', 12, 4096, true, 1e-6, 1, true, 'bf16'),
  ],
  silu_mul: [
    siluMulCase('3 x 21', 3, 21, 1),
    siluMulCase('1 x 256', 1, 256, 1),
    siluMulCase('2 x 33, large gates', 2, 33, 12),
    // Prefill rows (CUDA: a row per block row, four elements a thread, past 8 rows).
    siluMulCase('40 x 1028, large gates', 40, 1028, 12),
    // bf16 outs (capabilities.activationDtypes): the down projection's input.
    siluMulCase('bf16 out, 3 x 21', 3, 21, 1, 'bf16'),
    siluMulCase('bf16 out, 40 x 1028, large gates', 40, 1028, 12, 'bf16'),
  ],
  add: [addCase('length 1', 1), addCase('length 7', 7), addCase('length 1001', 1001)],
  gather_rows: [gatherCase('5 of 12 rows x 9', 12, 5, 9), gatherCase('1 of 3 rows x 64', 3, 1, 64), gatherCase('4 of 6 rows x 1', 6, 4, 1), gatherCase('4 of 7 rows x 8, rows 1 and 3 skipped', 7, 4, 8, [1, 3])],
  rope: [
    ropeCase('q heads of packed qkv, no norm', { rows: 3, numHeads: 4, headDim: 16, rowStride: 128, headOffset: 0, norm: false, maxPos: 200, base: 10000 }),
    ropeCase('k heads of packed qkv, QK-norm', { rows: 3, numHeads: 2, headDim: 16, rowStride: 128, headOffset: 64, norm: true, maxPos: 4096, base: 10000 }),
    ropeCase('headDim 6, offset 1, QK-norm eps 1e-5', { rows: 5, numHeads: 3, headDim: 6, rowStride: 20, headOffset: 1, norm: true, eps: 1e-5, maxPos: 40000, base: 1e6 }),
    ropeCase('headDim 128, base 1e6, long positions', { rows: 2, numHeads: 2, headDim: 128, rowStride: 256, headOffset: 0, norm: false, maxPos: 32768, base: 1e6 }),
    ropeCase('32 heads x 128, QK-norm', { rows: 4, numHeads: 32, headDim: 128, rowStride: 6144, headOffset: 1024, norm: true, maxPos: 8192, base: 1e6 }, true),
  ],
  kv_append: [
    kvAppendCase('packed qkv, 2 kv heads, one padding row', { rows: 4, numKvHeads: 2, headDim: 8, rowStride: 64, kOffset: 32, vOffset: 48, slots: 12, padding: 1 }),
    kvAppendCase('1 row, headDim 6', { rows: 1, numKvHeads: 1, headDim: 6, rowStride: 18, kOffset: 6, vOffset: 12, slots: 7, padding: 0 }),
    kvAppendCase('7 rows, 4 kv heads, v before k, padding', { rows: 7, numKvHeads: 4, headDim: 16, rowStride: 130, kOffset: 66, vOffset: 1, slots: 20, padding: 2 }),
  ],
};
