/**
 * The backend conformance suite: every op of the catalogue run on a backend under test and on a
 * reference backend (the CPU backend) with identical random inputs, outputs compared within the
 * tolerance the tested backend declares. Core depends on nothing, so both backends come in as
 * arguments. A new backend is a package that passes this suite.
 *
 * Inputs come from a seeded PRNG keyed by the case name, so a case sees the same data whatever
 * subset of ops is run. Each case also checks for leaks: every buffer it allocates it frees, so
 * `stats().liveBuffers` must be back where it was afterwards on both backends.
 */
import type { Tier } from './tiers.js';
import type { DeviceBackend, DeviceBuffer, Numerics } from './backend.js';
import { f32ToBf16 } from './dtype.js';
import { OP_NAMES, type DecoderLayerWeights, type OpArgs, type OpName } from './ops.js';
import { mix32, sampleRow, uniformFromSeed, type SampleParams } from './sampling.js';

export interface ConformanceCaseResult {
  op: OpName;
  name: string;
  ok: boolean;
  /** Largest |backend - reference| over the float outputs (over the integer ones when the case has only those). */
  maxAbsErr: number;
  /** Largest |reference| over the float outputs. */
  maxRef: number;
  /** The bound maxAbsErr was held to: relTol × maxRef + absTol (0 for integer-only cases). */
  tol: number;
  /** Buffers the backend under test still had live after the case (should be 0). */
  leakedBuffers: number;
  /** Why the case failed: a thrown error, an integer mismatch, a leak on the reference. */
  error?: string;
}

export interface ConformanceOptions {
  /** Seed of the input generator (default 0x5eed). */
  seed?: number;
  /** Only these ops (default: every op of OP_NAMES). */
  ops?: OpName[];
  /** 'small' (default): CI-sized shapes. 'large' adds model-sized shapes. */
  sizes?: 'small' | 'large';
  /** Absolute tolerance floor added to relTol × max|reference| (default 1e-6). */
  absTol?: number;
  /** The numerics of the backends compared (runConformance sets it): 'bf16' leaves out exact-only cases. */
  numerics?: Numerics;
  /**
   * Both backends have capabilities.bf16Activations (runConformance sets it): the cases of bf16
   * rmsnorm and silu_mul outs and bf16 matmul inputs run only then.
   */
  bf16Activations?: boolean;
  /**
   * Optional op fields both backends take (runConformance sets them from their capabilities):
   * the cases that use one run only where it is true.
   */
  capabilities?: Partial<Record<CaseCapability, boolean>>;
}

/** Capabilities that add an optional field to an op (capabilities.sampleStepTail, decoderLayersEmbed). */
export type CaseCapability = 'sampleStepTail' | 'decoderLayersEmbed';
const CASE_CAPABILITIES: readonly CaseCapability[] = ['sampleStepTail', 'decoderLayersEmbed'];

export interface ConformanceCase {
  op: OpName;
  name: string;
  run(backend: DeviceBackend, reference: DeviceBackend): ConformanceCaseResult;
}

export interface ConformanceReport {
  backend: string;
  passed: number;
  failed: number;
  results: ConformanceCaseResult[];
}

// ---- inputs -------------------------------------------------------------------------------------

/** Deterministic PRNG for case inputs: a Weyl sequence through the sampler's mix32 hash. */
export class ConformanceRng {
  private state: number;
  private spare = NaN;
  constructor(seed: number) {
    this.state = mix32(seed >>> 0);
  }

  /** Uniform in [0, 1). */
  next(): number {
    this.state = (this.state + 0x9e3779b9) | 0;
    return mix32(this.state >>> 0) / 4294967296;
  }
  /** Integer in [lo, hi). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo));
  }
  /** Standard normal (Box-Muller; the second value of each pair is kept for the next call). */
  normal(): number {
    if (!Number.isNaN(this.spare)) {
      const z = this.spare;
      this.spare = NaN;
      return z;
    }
    const r = Math.sqrt(-2 * Math.log(1 - this.next()));
    const t = 2 * Math.PI * this.next();
    this.spare = r * Math.sin(t);
    return r * Math.cos(t);
  }
  normals(n: number, scale = 1): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = this.normal() * scale;
    return a;
  }
  /** A random permutation of 0..n-1. */
  perm(n: number): number[] {
    const p = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i > 0; i--) {
      const j = this.int(0, i + 1);
      [p[i], p[j]] = [p[j], p[i]];
    }
    return p;
  }
}

/** Round every value to the nearest bfloat16 in place (so it is exact in an f32 and a bf16 buffer alike). */
export function roundToBf16(a: Float32Array): Float32Array {
  const bits = bf16Bits(a);
  const u32 = new Uint32Array(a.buffer, a.byteOffset, a.length);
  for (let i = 0; i < a.length; i++) u32[i] = bits[i] << 16;
  return a;
}

/** Raw bfloat16 bits of float32 values (round to nearest even, as f32ToBf16), in one pass. */
function bf16Bits(a: Float32Array): Uint16Array {
  const u32 = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const out = new Uint16Array(a.length);
  for (let i = 0; i < a.length; i++) {
    const b = u32[i];
    out[i] = (b & 0x7fffffff) > 0x7f800000 ? f32ToBf16(a[i]) : ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
  }
  return out;
}

type HostData = Float32Array | Int32Array;

/**
 * A buffer of a case. 'bf16' holds bf16-rounded values: uploaded as bf16 where the backend
 * supports it, as f32 otherwise, so both backends see identical values.
 */
interface BufDef {
  dtype: 'f32' | 'i32' | 'bf16';
  data: HostData;
  /** Where to allocate it (default: the backend's compute tier). */
  tier?: Tier;
}

type Bufs = Record<string, DeviceBuffer>;

interface Step {
  op: OpName;
  run(backend: DeviceBackend, bufs: Bufs): void;
}

function step<K extends OpName>(op: K, args: (b: Bufs) => OpArgs<K>): Step {
  return { op, run: (be, b) => be.run(op, args(b)) };
}

/** Decides whether an integer mismatch at `index` is excused by a near-tie in the inputs. */
type Excuse = (index: number, got: number, ref: number, relTol: number, absTol: number) => boolean;

interface OutputDef {
  name: string;
  kind: 'float' | 'int';
  excuse?: Excuse;
  /**
   * A bf16 output: each value is an f32 result rounded to bf16 as it is stored, so where the two
   * backends' f32 results straddle a rounding boundary they differ by one bf16 unit in the last
   * place; such an element is no mismatch (it still counts in maxAbsErr).
   */
  bf16?: boolean;
}

interface CaseSpec {
  buffers: Record<string, BufDef>;
  steps: Step[];
  outputs: OutputDef[];
}

interface CaseDef {
  name: string;
  large?: boolean;
  /** Defined for exact numerics only (partial attention): left out for a bf16 backend. */
  exactOnly?: boolean;
  /** Needs capabilities.bf16Activations of both backends (bf16 outs or matmul inputs). */
  bf16Activations?: boolean;
  /** Needs this capability of both backends (an optional op field the case uses). */
  needs?: CaseCapability;
  build(rng: ConformanceRng): CaseSpec;
}

const f32 = (data: Float32Array): BufDef => ({ dtype: 'f32', data });
const i32 = (data: ArrayLike<number>): BufDef => ({ dtype: 'i32', data: Int32Array.from(data) });
const bf16 = (data: Float32Array): BufDef => ({ dtype: 'bf16', data: roundToBf16(data) });
const floatOut = (name: string): OutputDef => ({ name, kind: 'float' });
const bf16Out = (name: string): OutputDef => ({ name, kind: 'float', bf16: true });
/** One bf16 unit in the last place at the magnitude of x (2^(exponent - 7)). */
const bf16Ulp = (x: number): number => (x === 0 || !Number.isFinite(x) ? 0 : 2 ** (Math.floor(Math.log2(Math.abs(x))) - 7));
const intOut = (name: string, excuse?: Excuse): OutputDef => ({ name, kind: 'int', excuse });

function invFreq(headDim: number, base: number): Float32Array {
  const a = new Float32Array(headDim / 2);
  for (let i = 0; i < a.length; i++) a[i] = base ** ((-2 * i) / headDim);
  return a;
}

// ---- cases --------------------------------------------------------------------------------------

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
    bf16Activations: out === 'bf16',
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

interface MatmulShape {
  rows: number;
  inDim: number;
  outDim: number;
  bias?: boolean;
  weightOffset?: number;
  weight?: 'f32' | 'bf16';
  /** A bf16 x (capabilities.bf16Activations; more than 8 rows). */
  x?: 'bf16';
}

function matmulCase(name: string, s: MatmulShape, large = false): CaseDef {
  return {
    name,
    large,
    bf16Activations: s.x === 'bf16',
    build: (rng) => {
      const off = s.weightOffset ?? 0;
      // Values around the used window are garbage a backend must not read.
      const w = rng.normals(off + s.outDim * s.inDim + 17, 1 / Math.sqrt(s.inDim));
      const buffers: Record<string, BufDef> = {
        x: s.x === 'bf16' ? bf16(rng.normals(s.rows * s.inDim)) : f32(rng.normals(s.rows * s.inDim)),
        weight: s.weight === 'bf16' ? bf16(w) : f32(w),
        out: f32(rng.normals(s.rows * s.outDim + 5)),
      };
      if (s.bias) buffers.bias = f32(rng.normals(s.outDim));
      return {
        buffers,
        steps: [
          step('matmul', (b) => ({
            x: b.x,
            weight: b.weight,
            out: b.out,
            rows: s.rows,
            inDim: s.inDim,
            outDim: s.outDim,
            ...(s.bias ? { bias: b.bias } : {}),
            ...(s.weightOffset !== undefined ? { weightOffset: s.weightOffset } : {}),
          })),
        ],
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

function pagedLayout(rng: ConformanceRng, seqLens: readonly number[], blockSize: number): PagedLayout {
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
function poisonSlots(k: Float32Array, v: Float32Array, kvw: number, visible: Uint8Array, kScale = 40, vShift = 1000, vScale = 100): void {
  for (let sl = 0; sl < visible.length; sl++) {
    if (visible[sl]) continue;
    for (let i = 0; i < kvw; i++) {
      k[sl * kvw + i] *= kScale;
      v[sl * kvw + i] = vShift + vScale * v[sl * kvw + i];
    }
  }
}

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

interface FusedMatmulShape {
  rows: number;
  inDim: number;
  outDim: number;
  norm?: boolean;
  glu?: boolean;
  accumulate?: boolean;
  bias?: boolean;
  weight?: 'f32' | 'bf16';
  eps?: number;
}

function fusedMatmulCase(name: string, s: FusedMatmulShape, large = false): CaseDef {
  return {
    name,
    large,
    build: (rng) => {
      const wRows = s.glu ? 2 * s.outDim : s.outDim;
      const w = rng.normals(wRows * s.inDim, 1 / Math.sqrt(s.inDim));
      const buffers: Record<string, BufDef> = {
        // A norm input far from unit scale, so a backend that skips the normalization is caught.
        x: f32(rng.normals(s.rows * s.inDim, s.norm ? 7 : 1.5)),
        weight: s.weight === 'bf16' ? bf16(w) : f32(w),
        out: f32(rng.normals(s.rows * s.outDim + 3, 2)),
      };
      if (s.bias) buffers.bias = f32(rng.normals(s.outDim));
      if (s.norm) buffers.normWeight = f32(rng.normals(s.inDim, 0.3).map((v) => 1 + v));
      return {
        buffers,
        steps: [
          step('fused_matmul', (b) => ({
            x: b.x,
            weight: b.weight,
            out: b.out,
            rows: s.rows,
            inDim: s.inDim,
            outDim: s.outDim,
            ...(s.bias ? { bias: b.bias } : {}),
            ...(s.norm ? { normWeight: b.normWeight, eps: s.eps ?? 1e-6 } : {}),
            ...(s.glu ? { glu: true } : {}),
            ...(s.accumulate ? { accumulate: true } : {}),
          })),
        ],
        outputs: [floatOut('out')],
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
  weight: 'f32' | 'bf16';
  qkNorm: boolean;
  qkvBias: boolean;
  oBias?: boolean;
  eps?: number;
  /** The rows come from an embedding table of `vocab` rows (op decoder_layers' embed). */
  embed?: { vocab: number; table: 'f32' | 'bf16' };
  /** Op decoder_layers' maxKeys: a bound on every row's keys, by which a backend may pick its attention. */
  maxKeys?: number;
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
    ...(s.embed ? { needs: 'decoderLayersEmbed' as const } : {}),
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
      const wb = s.weight === 'bf16' ? bf16 : f32;
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
        buffers[`L${l}.qkv`] = wb(rng.normals(qkvOut * H, 1 / Math.sqrt(H)));
        if (s.qkvBias) buffers[`L${l}.qkvBias`] = f32(rng.normals(qkvOut, 0.5));
        if (s.qkNorm) {
          buffers[`L${l}.qNorm`] = normW(hd);
          buffers[`L${l}.kNorm`] = normW(hd);
        }
        buffers[`L${l}.o`] = wb(rng.normals(H * qw, 1 / Math.sqrt(qw)));
        if (s.oBias) buffers[`L${l}.oBias`] = f32(rng.normals(H, 0.1));
        buffers[`L${l}.mlpNorm`] = normW(H);
        buffers[`L${l}.gateUp`] = wb(rng.normals(2 * I * H, 1 / Math.sqrt(H)));
        buffers[`L${l}.down`] = wb(rng.normals(H * I, 1 / Math.sqrt(I)));
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

/** Decode rows (the last position) of every sequence. */
const decodeRows = (lens: number[]): Array<[number, number]> => lens.map((n, q) => [q, n - 1]);

/**
 * mlp_slice with its weights (and staging) in the host tier: compute near data. Weights are bf16,
 * what a GPU backend stores and its host kernels read (the CPU reference also takes f32: its own
 * tests cover that).
 */
function mlpSliceCase(name: string, rows: number, hidden: number, inter: number, weight: 'f32' | 'bf16'): CaseDef {
  return {
    name,
    build: (rng) => {
      const w = (n: number, fan: number) => rng.normals(n, 1 / Math.sqrt(fan));
      const host = (d: BufDef): BufDef => ({ ...d, tier: 'pinned' });
      const wt = (d: Float32Array) => host(weight === 'bf16' ? bf16(d) : f32(d));
      return {
        buffers: {
          // Far from unit scale, so a backend that skips the normalization is caught.
          x: f32(rng.normals(rows * hidden, 6)),
          normWeight: host(f32(rng.normals(hidden, 0.3).map((v) => 1 + v))),
          gateUp: wt(w(2 * inter * hidden, hidden)),
          down: wt(w(hidden * inter, Math.max(inter, 1))),
          out: f32(rng.normals(rows * hidden + 2, 3)),
          xHost: host(f32(new Float32Array(rows * hidden))),
          yHost: host(f32(new Float32Array(rows * hidden))),
        },
        steps: [
          step('mlp_slice', (b) => ({ x: b.x, normWeight: b.normWeight, gateUp: b.gateUp, down: b.down, out: b.out, rows, hidden, inter, eps: 1e-6, xHost: b.xHost, yHost: b.yHost })),
        ],
        outputs: [floatOut('out')],
      };
    },
  };
}

function siluMulCase(name: string, rows: number, dim: number, scale: number, out: 'f32' | 'bf16' = 'f32'): CaseDef {
  return {
    name,
    bf16Activations: out === 'bf16',
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

/**
 * Router logits with well separated values (a shuffled ladder with step 0.08 plus noise under
 * 0.02), so the top-k set is never decided by rounding.
 */
function routerLogits(rng: ConformanceRng, rows: number, experts: number): Float32Array {
  const a = new Float32Array(rows * experts);
  for (let r = 0; r < rows; r++) {
    const p = rng.perm(experts);
    for (let e = 0; e < experts; e++) a[r * experts + e] = (p[e] - experts / 2) * 0.08 + (rng.next() - 0.5) * 0.02;
  }
  return a;
}

/** Softmax of one row in float64 (for the near-tie excuse of topIds). */
function softmaxRow(x: ArrayLike<number>, off: number, n: number): Float64Array {
  const p = new Float64Array(n);
  let max = -Infinity;
  for (let i = 0; i < n; i++) max = Math.max(max, x[off + i]);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += p[i] = Math.exp(x[off + i] - max);
  for (let i = 0; i < n; i++) p[i] /= sum;
  return p;
}

function moeRouteCase(name: string, rows: number, numExperts: number, topK: number, normalize: boolean): CaseDef {
  return {
    name,
    build: (rng) => {
      const logits = routerLogits(rng, rows, numExperts);
      const excuse: Excuse = (i, got, ref, relTol, absTol) => {
        const r = Math.floor(i / topK);
        const p = softmaxRow(logits, r * numExperts, numExperts);
        return got >= 0 && got < numExperts && Math.abs(p[got] - p[ref]) <= relTol + absTol;
      };
      return {
        buffers: { logits: f32(logits), topIds: i32(new Int32Array(rows * topK).fill(-7)), topWeights: f32(rng.normals(rows * topK)) },
        steps: [step('moe_route', (b) => ({ logits: b.logits, topIds: b.topIds, topWeights: b.topWeights, rows, numExperts, topK, normalize }))],
        outputs: [intOut('topIds', excuse), floatOut('topWeights')],
      };
    },
  };
}

function moeMlpCase(name: string, rows: number, hidden: number, inter: number, experts: number, topK: number, weight: 'f32' | 'bf16'): CaseDef {
  return {
    name,
    build: (rng) => {
      const ids: number[] = [];
      const wts = new Float32Array(rows * topK);
      for (let r = 0; r < rows; r++) {
        const chosen = rng.perm(experts).slice(0, topK);
        let sum = 0;
        for (let k = 0; k < topK; k++) sum += wts[r * topK + k] = 0.1 + rng.next();
        for (let k = 0; k < topK; k++) wts[r * topK + k] /= sum;
        ids.push(...chosen);
      }
      const gu = rng.normals(experts * 2 * inter * hidden, 1 / Math.sqrt(hidden));
      const dn = rng.normals(experts * hidden * inter, 1 / Math.sqrt(inter));
      const wb = weight === 'bf16' ? bf16 : f32;
      return {
        buffers: {
          x: f32(rng.normals(rows * hidden)),
          topIds: i32(ids),
          topWeights: f32(wts),
          gateUp: wb(gu),
          down: wb(dn),
          out: f32(rng.normals(rows * hidden + 1)),
        },
        steps: [
          step('moe_mlp', (b) => ({
            x: b.x,
            topIds: b.topIds,
            topWeights: b.topWeights,
            gateUp: b.gateUp,
            down: b.down,
            out: b.out,
            rows,
            hidden,
            inter,
            topK,
          })),
        ],
        outputs: [floatOut('out')],
      };
    },
  };
}

function argmaxCase(name: string, rows: number, vocab: number, withTie: boolean, large = false): CaseDef {
  return {
    name,
    large,
    build: (rng) => {
      const logits = rng.normals(rows * vocab, 2);
      if (withTie && vocab >= 3) {
        // An exact tie: the contract says lowest index, so this one is not excused.
        let m = -Infinity;
        for (let i = 0; i < vocab; i++) m = Math.max(m, logits[i]);
        logits[vocab - 1] = m + 1;
        logits[1] = m + 1;
      }
      const excuse: Excuse = (r, got, ref, relTol, absTol) => {
        if (got < 0 || got >= vocab) return false;
        const a = logits[r * vocab + got];
        const b = logits[r * vocab + ref];
        let max = 0;
        for (let i = 0; i < vocab; i++) max = Math.max(max, Math.abs(logits[r * vocab + i]));
        return a !== b && Math.abs(a - b) <= relTol * max + absTol;
      };
      return {
        buffers: { logits: f32(logits), out: i32(new Int32Array(rows).fill(-3)) },
        steps: [step('argmax', (b) => ({ logits: b.logits, out: b.out, rows, vocab }))],
        outputs: [intOut('out', excuse)],
      };
    },
  };
}

/**
 * Sampling: several parameter sets per call and `draws` calls on the same rng buffer, so the
 * counter the op advances is exercised. A mismatch is excused only when nudging u, topP or minP
 * by a tolerance-sized amount makes the reference rule pick the backend's token.
 */
/**
 * `tail`: each draw also pushes its tokens into a ring and advances the rows' positions and
 * slots (op sample's push and advance, capabilities.sampleStepTail), as a decode step's tail.
 */
interface SampleTail {
  capacity: number;
  cursor: number;
  blockSize: number;
}

function sampleCase(name: string, vocab: number, params: number[][], draws: number, scale: number, tail?: SampleTail): CaseDef {
  return {
    name,
    ...(tail !== undefined ? { needs: 'sampleStepTail' as const } : {}),
    build: (rng) => {
      const rows = params.length;
      const logits = rng.normals(rows * vocab, scale);
      const state = new Int32Array(rows * 2);
      for (let r = 0; r < rows; r++) {
        state[2 * r] = (rng.int(0, 0x7fffffff) * (rng.next() < 0.5 ? -1 : 1)) | 0;
        state[2 * r + 1] = rng.int(0, 1 << 20);
      }
      const p32 = Float32Array.from(params.flat());
      const excuseFor =
        (draw: number): Excuse =>
        (r, got, ref, relTol, absTol) => {
          if (got < 0 || got >= vocab) return false;
          const u = uniformFromSeed(state[2 * r], (state[2 * r + 1] + draw) | 0);
          const d = Math.max(16 * relTol, absTol);
          const base: SampleParams = { temperature: p32[4 * r], topK: p32[4 * r + 1], topP: p32[4 * r + 2], minP: p32[4 * r + 3] };
          const tries: Array<[SampleParams, number]> = [
            [base, Math.min(u + d, 1 - 1e-12)],
            [base, Math.max(u - d, 0)],
            [{ ...base, topP: base.topP + d }, u],
            [{ ...base, topP: base.topP - d }, u],
            [{ ...base, minP: base.minP * (1 + d) }, u],
            [{ ...base, minP: base.minP * (1 - d) }, u],
          ];
          return ref !== got && tries.some(([sp, uu]) => sampleRow(logits, r * vocab, vocab, sp, uu) === got);
        };
      const buffers: Record<string, BufDef> = { logits: f32(logits), params: f32(p32), rng: i32(state) };
      const steps: Step[] = [];
      const outputs: OutputDef[] = [];
      // The tail's state: a ring partly filled, each row at a position of its own whose next
      // positions cross block boundaries within the draws, tables in a shuffled order.
      const maxBlocks = tail ? Math.ceil((3 * tail.blockSize + draws) / tail.blockSize) + 1 : 0;
      if (tail) {
        buffers.ring = i32(Array.from({ length: tail.capacity }, () => -1 - rng.int(0, 100)));
        buffers.cursor = i32([tail.cursor]);
        buffers.blockTables = i32(rng.perm(rows * maxBlocks));
        buffers.rowSeq = i32(rng.perm(rows));
        buffers.positions = i32(Array.from({ length: rows }, (_, r) => tail.blockSize * (1 + (r % 3)) - 1 - (r % 2)));
        buffers.slots = i32(new Int32Array(rows).fill(-9));
      }
      const tailArgs = (b: Record<string, DeviceBuffer>) =>
        tail
          ? {
              push: { ring: b.ring, cursor: b.cursor, capacity: tail.capacity },
              advance: { positions: b.positions, slots: b.slots, blockTables: b.blockTables, rowSeq: b.rowSeq, blockSize: tail.blockSize, maxBlocksPerSeq: maxBlocks },
            }
          : {};
      for (let d = 0; d < draws; d++) {
        buffers[`out${d}`] = i32(new Int32Array(rows).fill(-5));
        steps.push(step('sample', (b) => ({ logits: b.logits, params: b.params, rng: b.rng, out: b[`out${d}`], rows, vocab, ...tailArgs(b) })));
        outputs.push(intOut(`out${d}`, excuseFor(d)));
      }
      outputs.push(intOut('rng'));
      if (tail) {
        // The ring holds the draws' tokens: where a sampled token may differ within the excuse,
        // it would differ there too, so the ring is compared where every row is greedy.
        if (params.every((q) => q[0] === 0)) outputs.push(intOut('ring'));
        outputs.push(intOut('cursor'), intOut('positions'), intOut('slots'));
      }
      return { buffers, steps, outputs };
    },
  };
}

function ringPushCase(name: string, capacity: number, cursor: number, pushes: number[]): CaseDef {
  return {
    name,
    build: (rng) => {
      const buffers: Record<string, BufDef> = {
        ring: i32(Array.from({ length: capacity }, () => -1 - rng.int(0, 100))),
        cursor: i32([cursor]),
      };
      const steps: Step[] = [];
      pushes.forEach((rows, i) => {
        buffers[`src${i}`] = i32(Array.from({ length: rows }, () => rng.int(0, 150000)));
        steps.push(step('ring_push', (b) => ({ src: b[`src${i}`], ring: b.ring, cursor: b.cursor, rows, capacity })));
      });
      return { buffers, steps, outputs: [intOut('ring'), intOut('cursor')] };
    },
  };
}

function advanceCase(name: string, blockSize: number, seqLens: number[], steps: number): CaseDef {
  return {
    name,
    build: (rng) => {
      const maxBlocks = Math.ceil((Math.max(...seqLens) + steps) / blockSize) + 1;
      const numBlocks = seqLens.length * maxBlocks;
      const order = rng.perm(numBlocks);
      const tables = new Int32Array(seqLens.length * maxBlocks);
      for (let i = 0; i < tables.length; i++) tables[i] = order[i];
      // Rows in a different order than sequences, as a batch after preemption would be.
      const rowOrder = rng.perm(seqLens.length);
      const rows = rowOrder.length;
      const st: Step[] = [];
      for (let i = 0; i < steps; i++) {
        st.push(
          step('advance_positions', (b) => ({ positions: b.positions, slots: b.slots, blockTables: b.blockTables, rowSeq: b.rowSeq, rows, blockSize, maxBlocksPerSeq: maxBlocks })),
        );
      }
      return {
        buffers: {
          positions: i32(rowOrder.map((q) => seqLens[q] - 1)),
          slots: i32(new Int32Array(rows).fill(-9)),
          blockTables: i32(tables),
          rowSeq: i32(rowOrder),
        },
        steps: st,
        outputs: [intOut('positions'), intOut('slots')],
      };
    },
  };
}

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

/** Every op's cases; the mapped type makes an op added to the catalogue without cases a type error. */
const CASES: { [K in OpName]: CaseDef[] } = {
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
    // bf16 outs (capabilities.bf16Activations): the prefill norms before the projections.
    rmsnormCase('bf16 out, 3 x 17', 3, 17, false, 1e-6, 1, false, 'bf16'),
    rmsnormCase('bf16 out, 12 x 4096, residual', 12, 4096, true, 1e-6, 1, true, 'bf16'),
  ],
  matmul: [
    matmulCase('1 row 67 -> 29', { rows: 1, inDim: 67, outDim: 29 }),
    matmulCase('5 rows 64 -> 48, bias', { rows: 5, inDim: 64, outDim: 48, bias: true }),
    matmulCase('3 rows 33 -> 7, weightOffset 100', { rows: 3, inDim: 33, outDim: 7, weightOffset: 100 }),
    matmulCase('2 rows 3 -> 5', { rows: 2, inDim: 3, outDim: 5 }),
    matmulCase('1 row 256 -> 130, bf16 weights', { rows: 1, inDim: 256, outDim: 130, weight: 'bf16' }),
    matmulCase('8 rows 96 -> 80, bf16 weights, bias, weightOffset', { rows: 8, inDim: 96, outDim: 80, weight: 'bf16', bias: true, weightOffset: 96 * 3 }),
    matmulCase('1 row 1024 -> 4096, bf16 weights', { rows: 1, inDim: 1024, outDim: 4096, weight: 'bf16' }, true),
    matmulCase('17 rows 512 -> 1536, bias', { rows: 17, inDim: 512, outDim: 1536, bias: true }, true),
    // A bf16 x (capabilities.bf16Activations): the prefill projections' inputs.
    matmulCase('12 rows 64 -> 40, bf16 x, bf16 weights, bias', { rows: 12, inDim: 64, outDim: 40, weight: 'bf16', bias: true, x: 'bf16' }),
    matmulCase('70 rows 1024 -> 768, bf16 x, bf16 weights, weightOffset', { rows: 70, inDim: 1024, outDim: 768, weight: 'bf16', weightOffset: 1024 * 5, x: 'bf16' }, true),
  ],
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
  silu_mul: [
    siluMulCase('3 x 21', 3, 21, 1),
    siluMulCase('1 x 256', 1, 256, 1),
    siluMulCase('2 x 33, large gates', 2, 33, 12),
    // Prefill rows (CUDA: a row per block row, four elements a thread, past 8 rows).
    siluMulCase('40 x 1028, large gates', 40, 1028, 12),
    // bf16 outs (capabilities.bf16Activations): the down projection's input.
    siluMulCase('bf16 out, 3 x 21', 3, 21, 1, 'bf16'),
    siluMulCase('bf16 out, 40 x 1028, large gates', 40, 1028, 12, 'bf16'),
  ],
  add: [addCase('length 1', 1), addCase('length 7', 7), addCase('length 1001', 1001)],
  gather_rows: [gatherCase('5 of 12 rows x 9', 12, 5, 9), gatherCase('1 of 3 rows x 64', 3, 1, 64), gatherCase('4 of 6 rows x 1', 6, 4, 1), gatherCase('4 of 7 rows x 8, rows 1 and 3 skipped', 7, 4, 8, [1, 3])],
  moe_route: [
    moeRouteCase('4 rows, 8 experts, top 2, normalized', 4, 8, 2, true),
    moeRouteCase('3 rows, 60 experts, top 4, not normalized', 3, 60, 4, false),
    moeRouteCase('2 rows, 128 experts, top 8, normalized', 2, 128, 8, true),
    moeRouteCase('1 row, topK = numExperts = 5', 1, 5, 5, false),
  ],
  moe_mlp: [
    moeMlpCase('3 rows, hidden 16, inter 12, 4 experts, top 2', 3, 16, 12, 4, 2, 'f32'),
    moeMlpCase('2 rows, hidden 24, inter 10, 8 experts, top 3, bf16', 2, 24, 10, 8, 3, 'bf16'),
    moeMlpCase('1 row, hidden 7, inter 5, 3 experts, top 1', 1, 7, 5, 3, 1, 'f32'),
  ],
  argmax: [
    argmaxCase('4 rows x 1000, exact tie in row 0', 4, 1000, true),
    argmaxCase('1 row x 7', 1, 7, false),
    argmaxCase('3 rows x 4099', 3, 4099, false),
    argmaxCase('2 rows x 151936', 2, 151936, true, true),
  ],
  sample: [
    sampleCase(
      '5 param sets x 3 draws, vocab 257',
      257,
      [
        [0.7, 0, 1, 0],
        [1, 40, 0.9, 0],
        [1.3, 0, 0.8, 0.05],
        [0, 0, 1, 0],
        [1, 1, 1, 0],
      ],
      3,
      2,
    ),
    sampleCase(
      '2 param sets x 2 draws, vocab 5000',
      5000,
      [
        [0.8, 50, 0.95, 0.02],
        [1, 0, 1, 0],
      ],
      2,
      3,
    ),
    // A decode step's tail in one op (capabilities.sampleStepTail): CUDA runs one row's as one
    // kernel, more rows' as the separate ops' kernels.
    sampleCase('1 greedy row x 3 draws, vocab 151936, ring wraps, blockSize 16', 151936, [[0, 0, 1, 0]], 3, 3, { capacity: 4, cursor: 2, blockSize: 16 }),
    sampleCase('1 sampled row x 2 draws, vocab 5000, blockSize 4', 5000, [[0.9, 40, 0.95, 0]], 2, 2, { capacity: 16, cursor: 1000001, blockSize: 4 }),
    sampleCase(
      '3 greedy rows x 2 draws, vocab 4099, blockSize 8',
      4099,
      [
        [0, 0, 1, 0],
        [0, 0, 1, 0],
        [0, 0, 1, 0],
      ],
      2,
      2,
      { capacity: 8, cursor: 6, blockSize: 8 },
    ),
  ],
  ring_push: [ringPushCase('capacity 8, wraps', 8, 6, [4, 3]), ringPushCase('capacity 5, full pushes', 5, 1000003, [5, 2, 5])],
  advance_positions: [advanceCase('4 sequences, block boundaries, 3 steps', 4, [4, 1, 7, 12], 3), advanceCase('1 sequence, blockSize 16', 16, [31], 2)],
  mlp_slice: [
    mlpSliceCase('1 row, hidden 64, 24 channels, bf16', 1, 64, 24, 'bf16'),
    mlpSliceCase('3 rows, hidden 70, 33 channels (odd tails), bf16', 3, 70, 33, 'bf16'),
    mlpSliceCase('8 rows, hidden 128, 96 channels, bf16', 8, 128, 96, 'bf16'),
  ],
  fused_matmul: [
    fusedMatmulCase('1 row 64 -> 40, rmsnorm input', { rows: 1, inDim: 64, outDim: 40, norm: true }),
    fusedMatmulCase('3 rows 37 -> 11, rmsnorm input eps 1e-5, bias', { rows: 3, inDim: 37, outDim: 11, norm: true, eps: 1e-5, bias: true }),
    fusedMatmulCase('2 rows 48 -> 24, rmsnorm input, glu', { rows: 2, inDim: 48, outDim: 24, norm: true, glu: true }),
    fusedMatmulCase('1 row 13 -> 9, glu', { rows: 1, inDim: 13, outDim: 9, glu: true }),
    fusedMatmulCase('5 rows 32 -> 16, accumulate, bias', { rows: 5, inDim: 32, outDim: 16, accumulate: true, bias: true }),
    fusedMatmulCase('1 row 256 -> 96, bf16, rmsnorm input', { rows: 1, inDim: 256, outDim: 96, norm: true, weight: 'bf16' }),
    fusedMatmulCase('9 rows 64 -> 32, bf16, rmsnorm, glu', { rows: 9, inDim: 64, outDim: 32, norm: true, glu: true, weight: 'bf16' }),
    fusedMatmulCase('3 rows 64 -> 24, bf16, accumulate', { rows: 3, inDim: 64, outDim: 24, accumulate: true, weight: 'bf16' }),
    fusedMatmulCase('1 row 1024 -> 4096, bf16, rmsnorm input', { rows: 1, inDim: 1024, outDim: 4096, norm: true, weight: 'bf16' }, true),
    fusedMatmulCase('1 row 1024 -> 3072, bf16, rmsnorm, glu', { rows: 1, inDim: 1024, outDim: 3072, norm: true, glu: true, weight: 'bf16' }, true),
    fusedMatmulCase('1 row 3072 -> 1024, bf16, accumulate', { rows: 1, inDim: 3072, outDim: 1024, accumulate: true, weight: 'bf16' }, true),
    fusedMatmulCase('4 rows 2048 -> 1024, bf16, rmsnorm, accumulate', { rows: 4, inDim: 2048, outDim: 1024, norm: true, accumulate: true, weight: 'bf16' }, true),
    // Batched decode: past 8 rows a backend may switch to a GEMM with a fused epilogue.
    fusedMatmulCase('40 rows 1024 -> 3072, bf16, rmsnorm, glu', { rows: 40, inDim: 1024, outDim: 3072, norm: true, glu: true, weight: 'bf16' }, true),
    fusedMatmulCase('33 rows 3072 -> 1024, bf16, accumulate', { rows: 33, inDim: 3072, outDim: 1024, accumulate: true, weight: 'bf16' }, true),
    fusedMatmulCase('17 rows 256 -> 96, bf16, rmsnorm, bias', { rows: 17, inDim: 256, outDim: 96, norm: true, bias: true, weight: 'bf16' }, true),
  ],
  rope_append: [
    ropeAppendCase('GQA 2, QK-norm, one padding row', { rows: 3, numHeads: 4, numKvHeads: 2, headDim: 16, pad: 0, norm: true, slots: 9, padding: 1, maxPos: 5000 }),
    ropeAppendCase('MHA, no norm, headDim 6, padded row', { rows: 2, numHeads: 3, numKvHeads: 3, headDim: 6, pad: 5, norm: false, slots: 4, padding: 0, maxPos: 100 }),
    ropeAppendCase('16 q, 8 kv heads x 128, QK-norm', { rows: 1, numHeads: 16, numKvHeads: 8, headDim: 128, pad: 0, norm: true, slots: 64, padding: 0, maxPos: 40000 }, true),
    // Prefill rows: backends may take a row a block (CUDA: more than 8 rows, head sizes 64/128/256).
    ropeAppendCase('24 rows, GQA 2 x 64, no norm, padded rows', { rows: 24, numHeads: 4, numKvHeads: 2, headDim: 64, pad: 64, norm: false, slots: 40, padding: 2, maxPos: 3000 }),
    ropeAppendCase('80 rows, 32 q, 8 kv heads x 128, QK-norm', { rows: 80, numHeads: 32, numKvHeads: 8, headDim: 128, pad: 0, norm: true, slots: 128, padding: 3, maxPos: 40000 }, true),
  ],
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
    // A bound past CUDA's decodeShortKeys (1024): the split-KV kernel, whatever maxKeys says.
    decoderLayersCase('2 layers, 1 row, GQA 2 x 128, QK-norm, 1500 keys within maxKeys 2048', { ...gqa128Row, seqLens: [1500], weight: 'f32', maxKeys: 2048 }, true),
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

// ---- running ------------------------------------------------------------------------------------

interface Execution {
  outputs?: Record<string, HostData>;
  error?: string;
  leaked: number;
}

function message(e: unknown): string {
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}

/** Allocate, upload, run the steps, read the outputs, free everything (also on failure). */
function execute(be: DeviceBackend, spec: CaseSpec): Execution {
  const before = be.stats().liveBuffers;
  const bufs: Bufs = {};
  const result: Execution = { leaked: 0 };
  const halfOk = be.capabilities.dtypes.includes('bf16');
  try {
    for (const [name, def] of Object.entries(spec.buffers)) {
      const dtype = def.dtype === 'bf16' && !halfOk ? 'f32' : def.dtype;
      bufs[name] = be.alloc({ dtype, length: def.data.length, label: `conformance.${name}`, ...(def.tier ? { tier: def.tier } : {}) });
      be.write(bufs[name], dtype === 'bf16' ? bf16Bits(def.data as Float32Array) : def.data);
    }
    for (const s of spec.steps) s.run(be, bufs);
    const outputs: Record<string, HostData> = {};
    for (const o of spec.outputs) outputs[o.name] = be.read(bufs[o.name]);
    result.outputs = outputs;
  } catch (e) {
    result.error = message(e);
  } finally {
    for (const b of Object.values(bufs)) {
      try {
        be.free(b);
      } catch (e) {
        result.error ??= `free failed: ${message(e)}`;
      }
    }
    result.leaked = be.stats().liveBuffers - before;
  }
  return result;
}

interface Comparison {
  maxAbsErr: number;
  maxRef: number;
  tol: number;
  mismatch?: string;
}

function compare(spec: CaseSpec, got: Record<string, HostData>, ref: Record<string, HostData>, relTol: number, absTol: number): Comparison {
  let maxRef = 0;
  let hasFloat = false;
  for (const o of spec.outputs) {
    if (o.kind !== 'float') continue;
    hasFloat = true;
    // Infinite references (an empty partial's log-sum-exp is -Infinity) must match exactly and
    // do not widen the tolerance.
    for (const v of ref[o.name]) if (Number.isFinite(v)) maxRef = Math.max(maxRef, Math.abs(v));
  }
  const tol = hasFloat ? relTol * maxRef + absTol : 0;
  let maxAbsErr = 0;
  let mismatch: string | undefined;
  for (const o of spec.outputs) {
    const g = got[o.name];
    const r = ref[o.name];
    if (g.length !== r.length) {
      mismatch ??= `${o.name}: length ${g.length}, reference ${r.length}`;
      maxAbsErr = Infinity;
      continue;
    }
    if (o.kind === 'float') {
      for (let i = 0; i < r.length; i++) {
        const err = g[i] === r[i] ? 0 : Number.isNaN(g[i]) !== Number.isNaN(r[i]) ? Infinity : Number.isNaN(r[i]) ? 0 : Math.abs(g[i] - r[i]);
        if (err > maxAbsErr) maxAbsErr = err;
        if (err > tol && !(o.bf16 && err <= bf16Ulp(Math.max(Math.abs(g[i]), Math.abs(r[i])))))
          mismatch ??= `${o.name}[${i}]: got ${g[i]}, reference ${r[i]} (tol ${tol.toExponential(2)})`;
      }
    } else {
      for (let i = 0; i < r.length; i++) {
        if (g[i] === r[i] || o.excuse?.(i, g[i], r[i], relTol, absTol)) continue;
        mismatch ??= `${o.name}[${i}]: got ${g[i]}, reference ${r[i]}`;
        if (!hasFloat) maxAbsErr = Math.max(maxAbsErr, Math.abs(g[i] - r[i]));
      }
    }
  }
  return { maxAbsErr, maxRef, tol, mismatch };
}

function makeCase(op: OpName, def: CaseDef, seed: number, absTol: number): ConformanceCase {
  return {
    op,
    name: def.name,
    run(backend, reference) {
      const base = { op, name: def.name };
      let spec: CaseSpec;
      try {
        spec = def.build(new ConformanceRng(mix32((seed ^ hashString(`${op}/${def.name}`)) >>> 0)));
      } catch (e) {
        return { ...base, ok: false, maxAbsErr: Infinity, maxRef: 0, tol: 0, leakedBuffers: 0, error: `case setup: ${message(e)}` };
      }
      if (!backend.capabilities.ops.includes(op)) {
        return { ...base, ok: false, maxAbsErr: Infinity, maxRef: 0, tol: 0, leakedBuffers: 0, error: `op ${op} is not in the backend's capabilities.ops` };
      }
      const relTol = backend.capabilities.precision.relTol;
      const got = execute(backend, spec);
      const ref = reference === backend ? execute(backend, spec) : execute(reference, spec);
      const fail = (error: string, c?: Comparison): ConformanceCaseResult => ({
        ...base,
        ok: false,
        maxAbsErr: c?.maxAbsErr ?? Infinity,
        maxRef: c?.maxRef ?? 0,
        tol: c?.tol ?? 0,
        leakedBuffers: got.leaked,
        error,
      });
      if (got.error !== undefined) return fail(got.error);
      if (ref.error !== undefined) return fail(`reference failed: ${ref.error}`);
      const c = compare(spec, got.outputs!, ref.outputs!, relTol, absTol);
      if (c.mismatch !== undefined) return fail(`mismatch: ${c.mismatch}`, c);
      if (got.leaked !== 0) return fail(`backend leaked ${got.leaked} buffer(s)`, c);
      if (ref.leaked !== 0) return fail(`reference leaked ${ref.leaked} buffer(s)`, c);
      return { ...base, ok: true, maxAbsErr: c.maxAbsErr, maxRef: c.maxRef, tol: c.tol, leakedBuffers: 0 };
    },
  };
}

function hashString(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** The cases of the suite, in OP_NAMES order, for the selected ops and sizes. */
export function conformanceCases(opts: ConformanceOptions = {}): ConformanceCase[] {
  const seed = (opts.seed ?? 0x5eed) >>> 0;
  const absTol = opts.absTol ?? 1e-6;
  const ops = opts.ops ?? OP_NAMES;
  const out: ConformanceCase[] = [];
  for (const op of OP_NAMES) {
    if (!ops.includes(op)) continue;
    for (const def of CASES[op]) {
      if (def.large && opts.sizes !== 'large') continue;
      if (def.exactOnly && opts.numerics === 'bf16') continue;
      if (def.bf16Activations && !opts.bf16Activations) continue;
      if (def.needs && opts.capabilities?.[def.needs] !== true) continue;
      out.push(makeCase(op, def, seed, absTol));
    }
  }
  return out;
}

/**
 * Run every case of the suite on `backend` against `reference`. A case that throws becomes a
 * failed result carrying the message; the run itself never throws for a backend's failure.
 */
export async function runConformance(backend: DeviceBackend, reference: DeviceBackend, opts: ConformanceOptions = {}): Promise<ConformanceReport> {
  // A bf16-numerics backend rounds where an exact one does not: compare like with like.
  const bn = backend.capabilities.numerics ?? 'exact';
  const rn = reference.capabilities.numerics ?? 'exact';
  if (bn !== rn) throw new RangeError(`conformance: the backend has numerics '${bn}' but the reference has '${rn}'; create the reference with the same numerics`);
  const results: ConformanceCaseResult[] = [];
  const bf16Activations = backend.capabilities.bf16Activations === true && reference.capabilities.bf16Activations === true;
  const capabilities = Object.fromEntries(
    CASE_CAPABILITIES.map((k) => [k, backend.capabilities[k] === true && reference.capabilities[k] === true]),
  ) as Record<CaseCapability, boolean>;
  for (const c of conformanceCases({ ...opts, numerics: bn, bf16Activations, capabilities })) {
    let r: ConformanceCaseResult;
    try {
      r = c.run(backend, reference);
    } catch (e) {
      r = { op: c.op, name: c.name, ok: false, maxAbsErr: Infinity, maxRef: 0, tol: 0, leakedBuffers: 0, error: message(e) };
    }
    results.push(r);
    // Yield between cases so a long run does not starve the event loop.
    await Promise.resolve();
  }
  const passed = results.filter((r) => r.ok).length;
  return { backend: backend.name, passed, failed: results.length - passed, results };
}
