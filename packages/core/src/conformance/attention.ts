/** Conformance cases, attention family: paged attention (all-hot and tiered), attention_merge, rope_append. */
import { ConformanceRng, step, f32, i32, bf16, floatOut, invFreq, type BufDef, type CaseDef, type CaseTable } from './kit.js';

interface AttnShape {
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  blockSize: number;
  /** Context length of each sequence (positions 0..len-1 are in the cache). */
  seqLens: number[];
  /** Rows: [sequence, position]. */
  rows: Array<[number, number]>;
  /** Extra q row elements before (qOffset) and after the heads. */
  qPad?: [number, number];
  /** Sliding window (op attention's `window`). */
  window?: number;
  /** Cache dtype (default f32). */
  cache?: 'bf16';
  /** Pass op attention's `oneSequence` (every row must then be of one sequence). */
  oneSequence?: boolean;
}

/**
 * A paged KV layout: the blocks each sequence needs (plus one table entry more, and 2 spare
 * blocks that no sequence owns) handed out in a shuffled order, so tables are not contiguous.
 */
interface PagedLayout {
  tables: Int32Array;
  maxBlocks: number;
  numBlocks: number;
  /** Cache slot of position p of sequence q. */
  slotOf(q: number, p: number): number;
}

export function pagedLayout(rng: ConformanceRng, seqLens: readonly number[], blockSize: number): PagedLayout {
  const need = seqLens.map((n) => Math.ceil(n / blockSize));
  const maxBlocks = Math.max(...need) + 1;
  const spare = 2;
  const numBlocks = need.reduce((x, y) => x + y, 0) + spare;
  const order = rng.perm(numBlocks);
  const spareBlocks = order.slice(numBlocks - spare);
  const tables = new Int32Array(seqLens.length * maxBlocks);
  let next = 0;
  for (let q = 0; q < seqLens.length; q++) {
    for (let b = 0; b < maxBlocks; b++) tables[q * maxBlocks + b] = b < need[q] ? order[next++] : spareBlocks[b % spare];
  }
  return { tables, maxBlocks, numBlocks, slotOf: (q, p) => tables[q * maxBlocks + Math.floor(p / blockSize)] * blockSize + (p % blockSize) };
}

/**
 * Slots a row must not see (later positions, spare blocks) get large values, so reading past the
 * causal bound or an unused table entry shows as a large error.
 */
export function poisonSlots(k: Float32Array, v: Float32Array, kvw: number, visible: Uint8Array, kScale = 40, vShift = 1000, vScale = 100): void {
  for (let sl = 0; sl < visible.length; sl++) {
    if (visible[sl]) continue;
    for (let i = 0; i < kvw; i++) {
      k[sl * kvw + i] *= kScale;
      v[sl * kvw + i] = vShift + vScale * v[sl * kvw + i];
    }
  }
}

/** Decode rows (the last position) of every sequence. */
const decodeRows = (lens: number[]): Array<[number, number]> => lens.map((n, q) => [q, n - 1]);

function attentionCase(name: string, s: AttnShape, large = false): CaseDef {
  return {
    name,
    large,
    build: (rng) => {
      const kvw = s.numKvHeads * s.headDim;
      const qw = s.numHeads * s.headDim;
      const { tables, maxBlocks, numBlocks, slotOf } = pagedLayout(rng, s.seqLens, s.blockSize);
      const slots = numBlocks * s.blockSize;
      const k = rng.normals(slots * kvw);
      const v = rng.normals(slots * kvw);
      const visible = new Uint8Array(slots);
      if (s.window) {
        // Only what some row's window covers is visible.
        for (const [q, pos] of s.rows) for (let p = Math.max(0, pos - s.window + 1); p <= pos; p++) visible[slotOf(q, p)] = 1;
      } else {
        for (let q = 0; q < s.seqLens.length; q++) {
          for (let p = 0; p < s.seqLens[q]; p++) visible[slotOf(q, p)] = 1;
        }
      }
      poisonSlots(k, v, kvw, visible);
      const [before, after] = s.qPad ?? [0, 0];
      const stride = before + qw + after;
      const rows = s.rows.length;
      return {
        buffers: {
          q: f32(rng.normals(rows * stride)),
          kCache: s.cache === 'bf16' ? bf16(k) : f32(k),
          vCache: s.cache === 'bf16' ? bf16(v) : f32(v),
          out: f32(rng.normals(rows * qw + 3)),
          blockTables: i32(tables),
          rowSeq: i32(s.rows.map((r) => r[0])),
          positions: i32(s.rows.map((r) => r[1])),
        },
        steps: [
          step('attention', (b) => ({
            q: b.q,
            kCache: b.kCache,
            vCache: b.vCache,
            out: b.out,
            blockTables: b.blockTables,
            rowSeq: b.rowSeq,
            positions: b.positions,
            rows,
            numHeads: s.numHeads,
            numKvHeads: s.numKvHeads,
            headDim: s.headDim,
            blockSize: s.blockSize,
            maxBlocksPerSeq: maxBlocks,
            qRowStride: stride,
            qOffset: before,
            scale: 1 / Math.sqrt(s.headDim),
            ...(s.window !== undefined ? { window: s.window } : {}),
            ...(s.oneSequence ? { oneSequence: true } : {}),
          })),
        ],
        outputs: [floatOut('out')],
      };
    },
  };
}

/**
 * Tiered KV: each sequence's blocks are split at random between a hot cache (the compute tier)
 * and a warm one (the pinned host tier, with host staging); two partial attentions and
 * attention_merge give the whole attention. Sequence 0 is all hot and sequence 1 all warm, so
 * the empty partial (-Infinity) is exercised on both sides. Slots of the other tier's blocks are
 * poisoned in each cache.
 */
function tieredAttentionCase(name: string, s: AttnShape, large = false): CaseDef {
  return {
    name,
    large,
    exactOnly: true,
    build: (rng) => {
      const kvw = s.numKvHeads * s.headDim;
      const qw = s.numHeads * s.headDim;
      const { tables, maxBlocks, numBlocks } = pagedLayout(rng, s.seqLens, s.blockSize);
      const slots = numBlocks * s.blockSize;
      const hotT = new Int32Array(tables.length).fill(-1);
      const warmT = new Int32Array(tables.length).fill(-1);
      const hotVis = new Uint8Array(slots);
      const warmVis = new Uint8Array(slots);
      for (let q = 0; q < s.seqLens.length; q++) {
        const need = Math.ceil(s.seqLens[q] / s.blockSize);
        for (let b = 0; b < need; b++) {
          const id = tables[q * maxBlocks + b];
          const hot = q === 0 ? true : q === 1 ? false : rng.next() < 0.5;
          (hot ? hotT : warmT)[q * maxBlocks + b] = id;
          const vis = hot ? hotVis : warmVis;
          for (let i = 0; i < s.blockSize; i++) vis[id * s.blockSize + i] = 1;
        }
      }
      const kh = rng.normals(slots * kvw);
      const vh = rng.normals(slots * kvw);
      const kw = rng.normals(slots * kvw);
      const vw = rng.normals(slots * kvw);
      poisonSlots(kh, vh, kvw, hotVis);
      poisonSlots(kw, vw, kvw, warmVis);
      const [before, after] = s.qPad ?? [0, 0];
      const stride = before + qw + after;
      const rows = s.rows.length;
      const host = (d: BufDef): BufDef => ({ ...d, tier: 'pinned' });
      const common = {
        rows,
        numHeads: s.numHeads,
        numKvHeads: s.numKvHeads,
        headDim: s.headDim,
        blockSize: s.blockSize,
        maxBlocksPerSeq: maxBlocks,
        qRowStride: stride,
        qOffset: before,
        scale: 1 / Math.sqrt(s.headDim),
        ...(s.window !== undefined ? { window: s.window } : {}),
      };
      return {
        buffers: {
          q: f32(rng.normals(rows * stride)),
          kHot: f32(kh),
          vHot: f32(vh),
          kWarm: host(f32(kw)),
          vWarm: host(f32(vw)),
          out: f32(rng.normals(rows * qw)),
          lse: f32(rng.normals(rows * s.numHeads)),
          warmOut: f32(rng.normals(rows * qw)),
          warmLse: f32(rng.normals(rows * s.numHeads)),
          qHost: host(f32(new Float32Array(rows * qw))),
          outHost: host(f32(new Float32Array(rows * qw))),
          lseHost: host(f32(new Float32Array(rows * s.numHeads))),
          hotTables: i32(hotT),
          warmTables: i32(warmT),
          rowSeq: i32(s.rows.map((r) => r[0])),
          positions: i32(s.rows.map((r) => r[1])),
        },
        steps: [
          step('attention', (b) => ({ ...common, q: b.q, kCache: b.kHot, vCache: b.vHot, out: b.out, lse: b.lse, blockTables: b.hotTables, rowSeq: b.rowSeq, positions: b.positions })),
          step('attention', (b) => ({
            ...common,
            q: b.q,
            kCache: b.kWarm,
            vCache: b.vWarm,
            out: b.warmOut,
            lse: b.warmLse,
            blockTables: b.warmTables,
            rowSeq: b.rowSeq,
            positions: b.positions,
            qHost: b.qHost,
            outHost: b.outHost,
            lseHost: b.lseHost,
          })),
          step('attention_merge', (b) => ({ out: b.out, lse: b.lse, other: b.warmOut, otherLse: b.warmLse, rows, numHeads: s.numHeads, headDim: s.headDim })),
        ],
        outputs: [floatOut('out'), floatOut('lse')],
      };
    },
  };
}

/** attention_merge alone, with empty partials (-Infinity) on either side and on both. */
function attentionMergeCase(name: string, rows: number, numHeads: number, headDim: number): CaseDef {
  return {
    name,
    exactOnly: true,
    build: (rng) => {
      const n = rows * numHeads;
      const la = rng.normals(n, 4);
      const lb = rng.normals(n, 4);
      for (let i = 0; i < n; i++) {
        if (i % 5 === 1) la[i] = -Infinity;
        if (i % 7 === 2) lb[i] = -Infinity;
        if (i % 11 === 3) la[i] = lb[i] = -Infinity;
      }
      return {
        buffers: {
          out: f32(rng.normals(n * headDim)),
          lse: f32(la),
          other: f32(rng.normals(n * headDim)),
          otherLse: f32(lb),
        },
        steps: [step('attention_merge', (b) => ({ out: b.out, lse: b.lse, other: b.other, otherLse: b.otherLse, rows, numHeads, headDim }))],
        outputs: [floatOut('out'), floatOut('lse')],
      };
    },
  };
}

interface RopeAppendShape {
  rows: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  /** Extra row elements after v. */
  pad: number;
  norm: boolean;
  slots: number;
  padding: number;
  maxPos: number;
}

function ropeAppendCase(name: string, s: RopeAppendShape, large = false): CaseDef {
  return {
    name,
    large,
    build: (rng) => {
      const stride = (s.numHeads + 2 * s.numKvHeads) * s.headDim + s.pad;
      const w = s.numKvHeads * s.headDim;
      const slots = rng.perm(s.slots).slice(0, s.rows);
      for (let i = 0; i < s.padding; i++) slots[rng.int(0, s.rows)] = -1;
      const positions = Array.from({ length: s.rows }, () => rng.int(0, s.maxPos));
      const buffers: Record<string, BufDef> = {
        qkv: f32(rng.normals(s.rows * stride, 2)),
        positions: i32(positions),
        invFreq: f32(invFreq(s.headDim, 1e6)),
        slots: i32(slots),
        kCache: f32(rng.normals(s.slots * w)),
        vCache: f32(rng.normals(s.slots * w)),
      };
      if (s.norm) {
        buffers.qNorm = f32(rng.normals(s.headDim, 0.3).map((v) => 1 + v));
        buffers.kNorm = f32(rng.normals(s.headDim, 0.3).map((v) => 1 + v));
      }
      return {
        buffers,
        steps: [
          step('rope_append', (b) => ({
            qkv: b.qkv,
            positions: b.positions,
            invFreq: b.invFreq,
            slots: b.slots,
            kCache: b.kCache,
            vCache: b.vCache,
            rows: s.rows,
            numHeads: s.numHeads,
            numKvHeads: s.numKvHeads,
            headDim: s.headDim,
            rowStride: stride,
            ...(s.norm ? { qNorm: b.qNorm, kNorm: b.kNorm, eps: 1e-6 } : {}),
          })),
        ],
        outputs: [floatOut('qkv'), floatOut('kCache'), floatOut('vCache')],
      };
    },
  };
}

export const attentionCases: Pick<CaseTable, 'attention' | 'attention_merge' | 'rope_append'> = {
  attention: [
    attentionCase('decode, MHA, 3 sequences', { numHeads: 4, numKvHeads: 4, headDim: 16, blockSize: 4, seqLens: [1, 6, 13], rows: decodeRows([1, 6, 13]) }),
    attentionCase('decode, GQA 2', { numHeads: 8, numKvHeads: 4, headDim: 32, blockSize: 8, seqLens: [17, 3, 30, 9], rows: decodeRows([17, 3, 30, 9]) }),
    attentionCase('decode, GQA 4, headDim 24, blockSize 5', { numHeads: 8, numKvHeads: 2, headDim: 24, blockSize: 5, seqLens: [11, 23], rows: decodeRows([11, 23]) }),
    attentionCase('decode, MQA, headDim 10', { numHeads: 6, numKvHeads: 1, headDim: 10, blockSize: 3, seqLens: [7, 2, 12], rows: decodeRows([7, 2, 12]), qPad: [0, 5] }),
    attentionCase('prefill chunk + decode rows, q in packed qkv', {
      numHeads: 4,
      numKvHeads: 2,
      headDim: 16,
      blockSize: 4,
      seqLens: [10, 15, 1],
      rows: [[0, 4], [0, 5], [0, 6], [0, 7], [0, 8], [0, 9], [1, 14], [2, 0]],
      qPad: [8, 64],
    }),
    attentionCase('whole prompt prefill, GQA 2', {
      numHeads: 2,
      numKvHeads: 1,
      headDim: 16,
      blockSize: 16,
      seqLens: [20],
      rows: Array.from({ length: 20 }, (_, p): [number, number] => [0, p]),
    }),
    attentionCase(
      'model-sized: 32 heads, 8 kv heads, 128 dim, chunk + decode',
      {
        numHeads: 32,
        numKvHeads: 8,
        headDim: 128,
        blockSize: 16,
        seqLens: [300, 517, 64],
        rows: [...Array.from({ length: 12 }, (_, i): [number, number] => [0, 288 + i]), [1, 516], [2, 63]],
      },
      true,
    ),
    // Many rows of one sequence: backends may take tiles of them to a tensor-core prefill kernel
    // (CUDA: 64 rows), the rest (sequence seams, decode rows) to the split-KV path.
    attentionCase(
      'prefill tiles: a 200-token prompt + 2 decode rows, 32 heads, 8 kv heads, 128 dim',
      {
        numHeads: 32,
        numKvHeads: 8,
        headDim: 128,
        blockSize: 16,
        seqLens: [200, 517, 64],
        rows: [...Array.from({ length: 200 }, (_, p): [number, number] => [0, p]), [1, 516], [2, 63]],
      },
      true,
    ),
    attentionCase(
      'prefill tiles: chunks of two sequences (one after a cached prefix) meeting mid-tile, window 100, 64 dim',
      {
        numHeads: 16,
        numKvHeads: 4,
        headDim: 64,
        blockSize: 16,
        seqLens: [428, 70],
        rows: [...Array.from({ length: 100 }, (_, i): [number, number] => [0, 328 + i]), ...Array.from({ length: 70 }, (_, p): [number, number] => [1, p])],
        qPad: [0, 2 * 4 * 64],
        window: 100,
      },
      true,
    ),
    attentionCase(
      'prefill tiles over a bf16 cache: 130-row chunk after 60 cached + decode rows, 128 dim',
      {
        numHeads: 16,
        numKvHeads: 2,
        headDim: 128,
        blockSize: 16,
        seqLens: [190, 77],
        rows: [...Array.from({ length: 130 }, (_, i): [number, number] => [0, 60 + i]), [1, 76]],
        cache: 'bf16',
      },
      true,
    ),
    // Prompt chunks of several sequences in one pass, each starting anywhere (a step of several
    // prompts): runs of 65 and 64 rows, a short one, a chunk after a cached prefix, a decode row.
    attentionCase(
      'prefill tiles: prompt chunks of five sequences in one pass, GQA 4, 128 dim',
      {
        numHeads: 16,
        numKvHeads: 4,
        headDim: 128,
        blockSize: 16,
        seqLens: [65, 64, 10, 150, 90],
        rows: [
          ...Array.from({ length: 65 }, (_, p): [number, number] => [0, p]),
          ...Array.from({ length: 64 }, (_, p): [number, number] => [1, p]),
          ...Array.from({ length: 10 }, (_, p): [number, number] => [2, p]),
          ...Array.from({ length: 130 }, (_, i): [number, number] => [3, 20 + i]),
          [4, 89],
        ],
      },
      true,
    ),
    // A pass of one sequence (oneSequence): every tile, the partial last one too, on the prefill kernel.
    attentionCase(
      'prefill tiles, one sequence: a 150-row chunk after 40 cached, 32 heads, 8 kv heads, 128 dim',
      {
        numHeads: 32,
        numKvHeads: 8,
        headDim: 128,
        blockSize: 16,
        seqLens: [190],
        rows: Array.from({ length: 150 }, (_, i): [number, number] => [0, 40 + i]),
        qPad: [0, 2 * 8 * 128],
        oneSequence: true,
      },
      true,
    ),
    attentionCase(
      'prefill tiles, one sequence over a bf16 cache: a 129-row prompt, 16 heads, 2 kv heads, 128 dim',
      {
        numHeads: 16,
        numKvHeads: 2,
        headDim: 128,
        blockSize: 16,
        seqLens: [129],
        rows: Array.from({ length: 129 }, (_, p): [number, number] => [0, p]),
        cache: 'bf16',
        oneSequence: true,
      },
      true,
    ),
    attentionCase(
      'prefill tiles, one sequence, GQA 3 (a q head a block), window 50: 70 rows after 30 cached, 64 dim',
      {
        numHeads: 12,
        numKvHeads: 4,
        headDim: 64,
        blockSize: 8,
        seqLens: [100],
        rows: Array.from({ length: 70 }, (_, i): [number, number] => [0, 30 + i]),
        qPad: [64, 2 * 4 * 64],
        window: 50,
        oneSequence: true,
      },
      true,
    ),
    attentionCase(
      'prefill tiles, one sequence, window 40, GQA 2: 90 rows after 20 cached, 64 dim',
      {
        numHeads: 8,
        numKvHeads: 4,
        headDim: 64,
        blockSize: 16,
        seqLens: [110],
        rows: Array.from({ length: 90 }, (_, i): [number, number] => [0, 20 + i]),
        window: 40,
        oneSequence: true,
      },
      true,
    ),
    attentionCase('decode, sliding window 5 (blocks before it unread)', { numHeads: 4, numKvHeads: 2, headDim: 16, blockSize: 4, seqLens: [3, 13, 22], rows: decodeRows([3, 13, 22]), window: 5 }),
    attentionCase('prefill chunk, sliding window 7', {
      numHeads: 4,
      numKvHeads: 2,
      headDim: 16,
      blockSize: 4,
      seqLens: [18],
      rows: Array.from({ length: 10 }, (_, i): [number, number] => [0, 8 + i]),
      window: 7,
    }),
    tieredAttentionCase('tiered: hot + warm partials merged, decode, GQA 2', { numHeads: 8, numKvHeads: 4, headDim: 32, blockSize: 4, seqLens: [9, 14, 30, 23], rows: decodeRows([9, 14, 30, 23]) }),
    tieredAttentionCase('tiered: prefill chunk + decode, MQA, headDim 24', {
      numHeads: 4,
      numKvHeads: 1,
      headDim: 24,
      blockSize: 3,
      seqLens: [7, 10, 19],
      rows: [[0, 6], [1, 9], [2, 14], [2, 15], [2, 16], [2, 17], [2, 18]],
      qPad: [4, 9],
    }),
    tieredAttentionCase('tiered with a sliding window 6', { numHeads: 4, numKvHeads: 2, headDim: 16, blockSize: 2, seqLens: [5, 11, 17], rows: decodeRows([5, 11, 17]), window: 6 }),
    tieredAttentionCase(
      'tiered prefill tiles: a 200-row chunk after 250 cached + decode rows, 128 dim',
      {
        numHeads: 16,
        numKvHeads: 4,
        headDim: 128,
        blockSize: 16,
        seqLens: [40, 33, 450, 90],
        rows: [[0, 39], [1, 32], ...Array.from({ length: 200 }, (_, i): [number, number] => [2, 250 + i]), [3, 89]],
      },
      true,
    ),
    tieredAttentionCase(
      'tiered, model-sized: 32 heads, 8 kv heads, 128 dim',
      { numHeads: 32, numKvHeads: 8, headDim: 128, blockSize: 16, seqLens: [100, 70, 517, 300], rows: decodeRows([100, 70, 517, 300]) },
      true,
    ),
  ],
  attention_merge: [attentionMergeCase('4 rows x 3 heads x 16, empty partials', 4, 3, 16), attentionMergeCase('1 row x 32 heads x 128', 1, 32, 128)],
  rope_append: [
    ropeAppendCase('GQA 2, QK-norm, one padding row', { rows: 3, numHeads: 4, numKvHeads: 2, headDim: 16, pad: 0, norm: true, slots: 9, padding: 1, maxPos: 5000 }),
    ropeAppendCase('MHA, no norm, headDim 6, padded row', { rows: 2, numHeads: 3, numKvHeads: 3, headDim: 6, pad: 5, norm: false, slots: 4, padding: 0, maxPos: 100 }),
    ropeAppendCase('16 q, 8 kv heads x 128, QK-norm', { rows: 1, numHeads: 16, numKvHeads: 8, headDim: 128, pad: 0, norm: true, slots: 64, padding: 0, maxPos: 40000 }, true),
    // Prefill rows: backends may take a row a block (CUDA: more than 8 rows, head sizes 64/128/256).
    ropeAppendCase('24 rows, GQA 2 x 64, no norm, padded rows', { rows: 24, numHeads: 4, numKvHeads: 2, headDim: 64, pad: 64, norm: false, slots: 40, padding: 2, maxPos: 3000 }),
    ropeAppendCase('80 rows, 32 q, 8 kv heads x 128, QK-norm', { rows: 80, numHeads: 32, numKvHeads: 8, headDim: 128, pad: 0, norm: true, slots: 128, padding: 3, maxPos: 40000 }, true),
  ],
};
