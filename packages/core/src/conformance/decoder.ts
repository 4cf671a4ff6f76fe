/** Conformance cases, the fused decoder stack: op decoder_layers. */
import { step, f32, i32, bf16, floatOut, invFreq, type BufDef, type Bufs, type OutputDef, type CaseDef, type CaseTable } from './kit.js';
import { pagedLayout, poisonSlots } from './attention.js';
import { weightBuf } from './matmul.js';
import { type DecoderLayerWeights } from '../ops.js';

interface DecoderShape {
  layers: number;
  hidden: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  intermediate: number;
  blockSize: number;
  /** Context length of each sequence, its current position included: one row per sequence, at seqLens[q] - 1. */
  seqLens: number[];
  /** Sequences whose row is padding (slot -1, nothing appended), as the padded rows of a captured batch. */
  padSeqs?: number[];
  /** q4_k: every projection in ggml's Q4_K blocks (rows of whole 256-element super-blocks). */
  weight: 'f32' | 'bf16' | 'q4_k';
  qkNorm: boolean;
  qkvBias: boolean;
  oBias?: boolean;
  eps?: number;
  /** The rows come from an embedding table of `vocab` rows (op decoder_layers' embed). */
  embed?: { vocab: number; table: 'f32' | 'bf16' };
  /** Op decoder_layers' maxKeys: a bound on every row's keys, by which a backend may pick its attention. */
  maxKeys?: number;
  /** Op decoder_layers' minKeys: a lower bound on every row's keys, likewise. */
  minKeys?: number;
}

/**
 * A decode step through a stack of dense layers, each with its own weights and paged caches.
 * Weights are scaled by 1/sqrt(fan-in) and norm weights are 1 + small noise, so activations stay
 * O(1) through the stack. Cache slots of earlier positions hold random keys and values; the slot of
 * each row's current position and every slot no row may read hold mildly poisoned values (mild,
 * because the caches are outputs and their magnitude sets the tolerance of the whole case).
 */
function decoderLayersCase(name: string, s: DecoderShape, large = false): CaseDef {
  return {
    name,
    large,
    ...(s.weight === 'q4_k' ? { dtype: 'q4_k' as const } : {}),
    ...(s.embed ? { fields: ['embed'] } : {}),
    build: (rng) => {
      const { hidden: H, numHeads: nq, numKvHeads: nkv, headDim: hd, intermediate: I } = s;
      const qkvOut = (nq + 2 * nkv) * hd;
      const qw = nq * hd;
      const kvw = nkv * hd;
      const eps = s.eps ?? 1e-6;
      const { tables, maxBlocks, numBlocks, slotOf } = pagedLayout(rng, s.seqLens, s.blockSize);
      const nSlots = numBlocks * s.blockSize;
      const rows = s.seqLens.length;
      // Rows in a different order than their sequences, as a batch after preemption would be.
      const rowSeq = rng.perm(rows);
      const pad = new Set(s.padSeqs ?? []);
      const positions = rowSeq.map((q) => s.seqLens[q] - 1);
      const slots = rowSeq.map((q) => (pad.has(q) ? -1 : slotOf(q, s.seqLens[q] - 1)));
      const visible = new Uint8Array(nSlots);
      for (let q = 0; q < rows; q++) {
        // A padding row reads its current slot without writing it.
        const seen = pad.has(q) ? s.seqLens[q] : s.seqLens[q] - 1;
        for (let p = 0; p < seen; p++) visible[slotOf(q, p)] = 1;
      }
      const wb = (n: number, inDim: number): BufDef => weightBuf(rng, s.weight, n, inDim);
      const normW = (n: number) => f32(rng.normals(n, 0.1).map((v) => 1 + v));
      const buffers: Record<string, BufDef> = {
        // Elements past rows*hidden must stay as they are.
        x: f32(rng.normals(rows * H + 3)),
        qkv: f32(rng.normals(rows * qkvOut)),
        attn: f32(rng.normals(rows * qw)),
        mlp: f32(rng.normals(rows * I)),
        positions: i32(positions),
        slots: i32(slots),
        blockTables: i32(tables),
        rowSeq: i32(rowSeq),
        invFreq: f32(invFreq(hd, 1e6)),
      };
      const outputs: OutputDef[] = [floatOut('x')];
      if (s.embed) {
        // Rows of unit scale, ids spread over the table (the last row included).
        buffers.table = (s.embed.table === 'bf16' ? bf16 : f32)(rng.normals(s.embed.vocab * H));
        buffers.ids = i32(Array.from({ length: rows }, (_, r) => (r === 0 ? s.embed!.vocab - 1 : rng.int(0, s.embed!.vocab))));
      }
      for (let l = 0; l < s.layers; l++) {
        buffers[`L${l}.attnNorm`] = normW(H);
        buffers[`L${l}.qkv`] = wb(qkvOut * H, H);
        if (s.qkvBias) buffers[`L${l}.qkvBias`] = f32(rng.normals(qkvOut, 0.5));
        if (s.qkNorm) {
          buffers[`L${l}.qNorm`] = normW(hd);
          buffers[`L${l}.kNorm`] = normW(hd);
        }
        buffers[`L${l}.o`] = wb(H * qw, qw);
        if (s.oBias) buffers[`L${l}.oBias`] = f32(rng.normals(H, 0.1));
        buffers[`L${l}.mlpNorm`] = normW(H);
        buffers[`L${l}.gateUp`] = wb(2 * I * H, H);
        buffers[`L${l}.down`] = wb(H * I, I);
        const k = rng.normals(nSlots * kvw);
        const v = rng.normals(nSlots * kvw);
        poisonSlots(k, v, kvw, visible, 3, 6, 1);
        buffers[`L${l}.kCache`] = f32(k);
        buffers[`L${l}.vCache`] = f32(v);
        outputs.push(floatOut(`L${l}.kCache`), floatOut(`L${l}.vCache`));
      }
      const layer = (b: Bufs, l: number): DecoderLayerWeights => ({
        attnNorm: b[`L${l}.attnNorm`],
        qkv: b[`L${l}.qkv`],
        ...(s.qkvBias ? { qkvBias: b[`L${l}.qkvBias`] } : {}),
        ...(s.qkNorm ? { qNorm: b[`L${l}.qNorm`], kNorm: b[`L${l}.kNorm`] } : {}),
        o: b[`L${l}.o`],
        ...(s.oBias ? { oBias: b[`L${l}.oBias`] } : {}),
        mlpNorm: b[`L${l}.mlpNorm`],
        gateUp: b[`L${l}.gateUp`],
        down: b[`L${l}.down`],
        kCache: b[`L${l}.kCache`],
        vCache: b[`L${l}.vCache`],
      });
      return {
        buffers,
        steps: [
          step('decoder_layers', (b) => ({
            x: b.x,
            qkv: b.qkv,
            attn: b.attn,
            mlp: b.mlp,
            positions: b.positions,
            slots: b.slots,
            blockTables: b.blockTables,
            rowSeq: b.rowSeq,
            invFreq: b.invFreq,
            layers: Array.from({ length: s.layers }, (_, l) => layer(b, l)),
            rows,
            hidden: H,
            numHeads: nq,
            numKvHeads: nkv,
            headDim: hd,
            intermediate: I,
            blockSize: s.blockSize,
            maxBlocksPerSeq: maxBlocks,
            eps,
            scale: 1 / Math.sqrt(hd),
            ...(s.embed ? { embed: { table: b.table, ids: b.ids } } : {}),
            ...(s.maxKeys !== undefined ? { maxKeys: s.maxKeys } : {}),
            ...(s.minKeys !== undefined ? { minKeys: s.minKeys } : {}),
          })),
        ],
        outputs,
      };
    },
  };
}

/** One decode row through two layers of headDim 128, two q heads a KV head (the maxKeys cases). */
const gqa128Row = {
  layers: 2,
  hidden: 128,
  numHeads: 4,
  numKvHeads: 2,
  headDim: 128,
  intermediate: 192,
  blockSize: 16,
  qkNorm: true,
  qkvBias: false,
} as const;

/** Qwen3-0.6B's layer shapes (bf16 weights, QK-norm, no biases), for the model-sized stack cases. */
const QWEN3_06B = {
  layers: 2,
  hidden: 1024,
  numHeads: 16,
  numKvHeads: 8,
  headDim: 128,
  intermediate: 3072,
  blockSize: 16,
  weight: 'bf16',
  qkNorm: true,
  qkvBias: false,
} as const satisfies Omit<DecoderShape, 'seqLens'>;

/** GQA 4 with headDim 128 (a KV group of four q heads), small enough for the CPU reference. */
const GQA4_HD128 = {
  layers: 2,
  hidden: 512,
  numHeads: 8,
  numKvHeads: 2,
  headDim: 128,
  intermediate: 1024,
  blockSize: 16,
  weight: 'bf16',
  qkNorm: true,
} as const satisfies Omit<DecoderShape, 'seqLens' | 'qkvBias'>;

export const decoderCases: Pick<CaseTable, 'decoder_layers'> = {
  decoder_layers: [
    // maxKeys: CUDA on sm_90 runs a one-row step of headDim 128 and at most two q heads a KV head
    // on its cluster attention (k_attn_decode_short: 8 blocks a KV head share the keys, their
    // partials merged in shared memory), the engine's short-context decode graph. 9 keys leave
    // half of a KV head's blocks without a key (empty partials in the merge); 1000 fill the tile.
    decoderLayersCase('2 layers, 1 row, GQA 2 x 128, QK-norm, 200 keys within maxKeys 1024', { ...gqa128Row, seqLens: [200], weight: 'f32', maxKeys: 1024 }),
    decoderLayersCase('2 layers, 1 row, MHA 2 x 128, QK-norm, bf16, 9 keys within maxKeys 64', {
      ...gqa128Row,
      hidden: 96,
      numHeads: 2,
      intermediate: 160,
      seqLens: [9],
      weight: 'bf16',
      maxKeys: 64,
    }),
    decoderLayersCase('2 layers, 1 row, GQA 2 x 128, QK-norm, bf16, 1000 keys within maxKeys 1024', { ...gqa128Row, seqLens: [1000], weight: 'bf16', maxKeys: 1024 }, true),
    // A bound past CUDA's shortContextKeys (1024): the split-KV kernel, whatever maxKeys says.
    decoderLayersCase('2 layers, 1 row, GQA 2 x 128, QK-norm, 1500 keys within maxKeys 2048', { ...gqa128Row, seqLens: [1500], weight: 'f32', maxKeys: 2048 }, true),
    // minKeys: CUDA runs one row whose keys reach its longContextKeys (8192) on the GQA kernel
    // (one block a KV head and split serving its q heads), after rope_append.
    decoderLayersCase('2 layers, 1 row, GQA 2 x 128, QK-norm, 9000 keys with minKeys 8192', { ...gqa128Row, seqLens: [9000], weight: 'f32', minKeys: 8192 }, true),
    decoderLayersCase('2 layers, 1 row, GQA 4 x 128, QK-norm, bf16, 8300 keys with minKeys 8192', { ...GQA4_HD128, seqLens: [8300], qkvBias: false, minKeys: 8192 }, true),
    // Q4_K projections (a GGUF model's decode step): the quantized matmuls inside the fused stack,
    // qkv and gate_up normalizing their rows themselves, o and down accumulating into x.
    decoderLayersCase('2 layers, 1 row, GQA 4 x 128, QK-norm, q4_k weights, 40 keys', {
      layers: 2,
      hidden: 1024,
      numHeads: 8,
      numKvHeads: 2,
      headDim: 128,
      intermediate: 1024,
      blockSize: 16,
      seqLens: [40],
      weight: 'q4_k',
      qkNorm: true,
      qkvBias: false,
    }),
    decoderLayersCase('2 layers, 1 row, GQA 2, QK-norm, f32', {
      layers: 2,
      hidden: 64,
      numHeads: 4,
      numKvHeads: 2,
      headDim: 16,
      intermediate: 96,
      blockSize: 4,
      seqLens: [7],
      weight: 'f32',
      qkNorm: true,
      qkvBias: false,
    }),
    decoderLayersCase('2 layers, 3 sequences, GQA 3, bf16, qkv and o bias', {
      layers: 2,
      hidden: 48,
      numHeads: 6,
      numKvHeads: 2,
      headDim: 8,
      intermediate: 80,
      blockSize: 4,
      seqLens: [5, 1, 12],
      weight: 'bf16',
      qkNorm: false,
      qkvBias: true,
      oBias: true,
      eps: 1e-5,
    }),
    decoderLayersCase('3 layers, 4 rows with one padding row, MHA, headDim 6, QK-norm', {
      layers: 3,
      hidden: 20,
      numHeads: 2,
      numKvHeads: 2,
      headDim: 6,
      intermediate: 28,
      blockSize: 3,
      seqLens: [3, 9, 1, 4],
      padSeqs: [2],
      weight: 'f32',
      qkNorm: true,
      qkvBias: false,
    }),
    // embed: CUDA gathers a one-row step's row in the first qkv kernel (bf16 table, lean GEMV);
    // other shapes run op embedding's kernel first.
    decoderLayersCase('2 layers, 1 row, bf16, rows from a bf16 embedding table', {
      layers: 2,
      hidden: 64,
      numHeads: 4,
      numKvHeads: 2,
      headDim: 16,
      intermediate: 96,
      blockSize: 4,
      seqLens: [9],
      weight: 'bf16',
      qkNorm: true,
      qkvBias: false,
      embed: { vocab: 50, table: 'bf16' },
    }),
    decoderLayersCase('2 layers, 3 sequences, f32, rows from an f32 embedding table', {
      layers: 2,
      hidden: 48,
      numHeads: 6,
      numKvHeads: 2,
      headDim: 8,
      intermediate: 80,
      blockSize: 4,
      seqLens: [5, 1, 12],
      weight: 'f32',
      qkNorm: false,
      qkvBias: true,
      embed: { vocab: 30, table: 'f32' },
    }),
    decoderLayersCase(
      'Qwen3-0.6B-like: 2 layers, 1 row, context 300',
      { ...QWEN3_06B, seqLens: [300] },
      true,
    ),
    decoderLayersCase(
      'Qwen3-0.6B-like: 2 layers, 1 row, context 300, rows from a bf16 embedding table',
      { ...QWEN3_06B, seqLens: [300], embed: { vocab: 2000, table: 'bf16' } },
      true,
    ),
    // A long context: CUDA's decode attention merges several clusters of splits per head.
    decoderLayersCase(
      'Qwen3-0.6B-like: 2 layers, 1 row, context 1500',
      { ...QWEN3_06B, seqLens: [1500] },
      true,
    ),
    decoderLayersCase(
      'Qwen3-0.6B-like: 2 layers, 4 rows, contexts 1, 17, 200, 513',
      { ...QWEN3_06B, seqLens: [1, 17, 200, 513] },
      true,
    ),
    decoderLayersCase(
      'Qwen3-0.6B-like: 2 layers, 12 rows (batched decode)',
      { ...QWEN3_06B, seqLens: [1, 5, 17, 40, 64, 65, 100, 130, 200, 257, 300, 513] },
      true,
    ),
    // Past 16 rows a backend may switch to an attention kernel per KV head (CUDA: GQA 1, 2, 4, 8).
    decoderLayersCase(
      'Qwen3-0.6B-like: 2 layers, 20 rows (batched decode, GQA 2), contexts to 700',
      { ...QWEN3_06B, seqLens: Array.from({ length: 20 }, (_, i) => 1 + ((i * 37) % 700)) },
      true,
    ),
    decoderLayersCase(
      'GQA 4, headDim 128: 2 layers, 18 rows, one padding row',
      { ...GQA4_HD128, seqLens: Array.from({ length: 18 }, (_, i) => 1 + ((i * 53) % 300)), padSeqs: [5], qkvBias: false },
      true,
    ),
    // One row with a qkv bias: CUDA's one-row decode path (the qkv GEMV with its norm, the split-KV
    // attention with RoPE and the KV append fused in) at six heads' rows a KV group.
    decoderLayersCase('GQA 4, headDim 128, qkv bias: 2 layers, 1 row, context 90', { ...GQA4_HD128, seqLens: [90], qkvBias: true }, true),
    decoderLayersCase(
      'Qwen2-0.5B-like: 2 layers, 2 rows, qkv bias, headDim 64, GQA 7',
      {
        layers: 2,
        hidden: 896,
        numHeads: 14,
        numKvHeads: 2,
        headDim: 64,
        intermediate: 4864,
        blockSize: 16,
        seqLens: [45, 130],
        weight: 'bf16',
        qkNorm: false,
        qkvBias: true,
      },
      true,
    ),
  ],
};
