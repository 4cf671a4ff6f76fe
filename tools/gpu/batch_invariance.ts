// GPU machine (phase `invariance`): batch invariance of the decode ops on the CUDA backend. Each
// decode-shaped op runs once per row alone (1 row) and then over 2..256 rows at once (fused_matmul
// also over 1000 and 4096, prompt-step sizes); every row of a many-row call must be bit for bit the
// row alone. Backends: batchInvariant true (must hold:
// exit 1 otherwise) and the default (informational: how many rows differ without it).
// Ops: fused_matmul (norm, norm + glu, accumulate on the split path, the 8B qkv shape whose staged
// norm does not fit shared memory past 2 rows, an LM-head shape, an inDim that is no multiple of
// 64 with a bias and a partial output tile) and decoder_layers (Qwen3-0.6B-like layers, f32 and
// bf16 KV caches, contexts 1..~700), and op attention over prompt chunks of several sequences
// against each chunk alone. fused_matmul's first rows (alone) are also checked against a
// float64 reference (|err| <= 1e-5 of the sum of |terms|): a kernel wrong the same way at every row
// count would pass the bit comparison. Writes $OUT/batch_invariance.json.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import type { DecoderLayerWeights, DeviceBackend, DeviceBuffer } from '@nerva/core';
import { createCudaBackend, probeCuda } from '@nerva/cuda-backend';

const out = process.env.OUT ?? '.';
const ROW_COUNTS = [2, 8, 9, 16, 17, 32, 64, 128, 256];
const MAX_ROWS = 256;

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
function normals(r: () => number, n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = Math.sqrt(-2 * Math.log(r() + 1e-12)) * Math.cos(2 * Math.PI * r()) * scale;
  return a;
}
function bf16Bits(a: Float32Array): Uint16Array {
  const u = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const o = new Uint16Array(a.length);
  for (let i = 0; i < a.length; i++) o[i] = (u[i] + 0x7fff + ((u[i] >>> 16) & 1)) >>> 16;
  return o;
}

interface Mismatch {
  rows: number;
  row: number;
  differing: number;
}
interface CaseResult {
  case: string;
  ok: boolean;
  rowCounts: number[];
  mismatchedRows: number;
  first?: Mismatch[];
  /** fused_matmul: max over the first rows' outputs of |got - ref| / (sum of |terms|), ref in float64. */
  maxScaledErr?: number;
  error?: string;
}

function bitsEqual(a: Float32Array, b: Float32Array): number {
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  let d = 0;
  for (let i = 0; i < ua.length; i++) if (ua[i] !== ub[i]) d++;
  return d;
}

class Bufs {
  list: DeviceBuffer[] = [];
  constructor(private be: DeviceBackend) {}
  f32(data: Float32Array | number, label: string): DeviceBuffer {
    const n = typeof data === 'number' ? data : data.length;
    const b = this.be.alloc({ dtype: 'f32', length: n, label });
    if (typeof data !== 'number') this.be.write(b, data);
    this.list.push(b);
    return b;
  }
  bf16(data: Float32Array, label: string): DeviceBuffer {
    const b = this.be.alloc({ dtype: 'bf16', length: data.length, label });
    this.be.write(b, bf16Bits(data));
    this.list.push(b);
    return b;
  }
  i32(data: ArrayLike<number>, label: string): DeviceBuffer {
    const b = this.be.alloc({ dtype: 'i32', length: data.length, label });
    this.be.write(b, Int32Array.from(data));
    this.list.push(b);
    return b;
  }
  freeAll(): void {
    for (const b of this.list) this.be.free(b);
    this.list = [];
  }
}

/** Runs `many(n)` (rows 0..n-1 at once) and `one(i)` (row i alone); compares every row's bits. */
function compareRows(name: string, rowLen: number, one: (i: number) => Float32Array, many: (n: number) => Float32Array, counts: readonly number[] = ROW_COUNTS): CaseResult {
  const alone: Float32Array[] = [];
  for (let i = 0; i < MAX_ROWS; i++) alone.push(one(i).slice(0, rowLen));
  let bad = 0;
  const first: Mismatch[] = [];
  for (const n of counts) {
    const got = many(n);
    // Calls past MAX_ROWS rows (prompt steps' GEMMs): their first MAX_ROWS rows are compared.
    for (let i = 0; i < Math.min(n, MAX_ROWS); i++) {
      const d = bitsEqual(got.subarray(i * rowLen, (i + 1) * rowLen), alone[i]);
      if (d > 0) {
        bad++;
        if (first.length < 4) first.push({ rows: n, row: i, differing: d });
      }
    }
  }
  return { case: name, ok: bad === 0, rowCounts: [...counts], mismatchedRows: bad, ...(first.length ? { first } : {}) };
}

// fused_matmul also at prompt-step sizes: a batch-invariant prompt step of several prompts runs
// every projection as fused_matmul over all their rows.
const FM_ROW_COUNTS = [...ROW_COUNTS, 1000, 4096];
const FM_MAX_ROWS = 4096;

interface FmShape {
  name: string;
  inDim: number;
  outDim: number;
  norm?: boolean;
  glu?: boolean;
  accumulate?: boolean;
  bias?: boolean;
}

const ACC_ROWS = 2;
// f32-grade matmuls (the three-term split, the GEMV) keep 1e-5; under matmul precision bf16
// (NERVA_MATMUL=bf16) each activation is rounded to bf16 once (relative error up to 2^-9 a
// product), so a product sum may err by up to ~2e-3 of sum |terms|: the bound is that rounding's.
const ACC_TOL = process.env.NERVA_MATMUL === 'bf16' ? 2 ** -9 : 1e-5;

function bf16Values(a: Float32Array): Float32Array {
  const b = bf16Bits(a);
  const u = new Uint32Array(b.length);
  for (let i = 0; i < b.length; i++) u[i] = b[i] << 16;
  return new Float32Array(u.buffer);
}

/**
 * Max over the outputs of |got - ref| / scale for one row: ref in float64 (norm x * inv * nw, the
 * dot products, bias, silu(gate) * up, + the initial out); scale bounds the propagated rounding
 * (the sums of |terms| of gate and up through silu * up, |bias|, |init|, |ref|).
 */
function fmScaledErr(s: FmShape, got: Float32Array, x: Float32Array, w: Float32Array, nw: Float32Array | undefined, bias: Float32Array | undefined, init: Float32Array): number {
  const xn = new Float64Array(s.inDim);
  let inv = 1;
  if (nw) {
    let ss = 0;
    for (let i = 0; i < s.inDim; i++) ss += x[i] * x[i];
    inv = 1 / Math.sqrt(ss / s.inDim + 1e-6);
  }
  for (let i = 0; i < s.inDim; i++) xn[i] = nw ? x[i] * inv * nw[i] : x[i];
  const dot = (o: number): [number, number] => {
    let d = 0, m = 0;
    const base = o * s.inDim;
    for (let i = 0; i < s.inDim; i++) {
      const p = xn[i] * w[base + i];
      d += p;
      m += Math.abs(p);
    }
    return [d, m];
  };
  let worst = 0;
  for (let o = 0; o < s.outDim; o++) {
    const [g0, gm] = dot(o);
    const g = g0 + (bias ? bias[o] : 0);
    let ref = g, scale = gm + (bias ? Math.abs(bias[o]) : 0);
    if (s.glu) {
      const [u, um] = dot(o + s.outDim);
      const silu = g / (1 + Math.exp(-g));
      ref = silu * u;
      scale = 1.1 * gm * Math.abs(u) + Math.abs(silu) * um;
    }
    if (s.accumulate) {
      ref += init[o];
      scale += Math.abs(init[o]);
    }
    scale += Math.abs(ref) + 1e-30;
    worst = Math.max(worst, Math.abs(got[o] - ref) / scale);
  }
  return worst;
}

function fusedMatmulCase(be: DeviceBackend, s: FmShape, seed: number): CaseResult {
  const r = rng(seed);
  const B = new Bufs(be);
  try {
    const nOut = s.glu ? 2 : 1;
    const wHost = normals(r, nOut * s.outDim * s.inDim, 1 / Math.sqrt(s.inDim));
    const w = B.bf16(wHost, 'w');
    const nwHost = s.norm ? normals(r, s.inDim, 0.1).map((v) => 1 + v) : undefined;
    const nw = nwHost ? B.f32(nwHost, 'nw') : undefined;
    const biasHost = s.bias ? normals(r, s.outDim, 0.5) : undefined;
    const bias = biasHost ? B.f32(biasHost, 'bias') : undefined;
    const xHost = normals(r, FM_MAX_ROWS * s.inDim);
    const outInit = normals(r, FM_MAX_ROWS * s.outDim);
    const x = B.f32(FM_MAX_ROWS * s.inDim, 'x');
    const o = B.f32(FM_MAX_ROWS * s.outDim, 'out');
    const run = (rows: number, xs: Float32Array, init: Float32Array): Float32Array => {
      be.write(x, xs);
      be.write(o, init);
      be.run('fused_matmul', {
        x,
        weight: w,
        out: o,
        rows,
        inDim: s.inDim,
        outDim: s.outDim,
        ...(nw ? { normWeight: nw, eps: 1e-6 } : {}),
        ...(bias ? { bias } : {}),
        ...(s.glu ? { glu: true } : {}),
        ...(s.accumulate ? { accumulate: true } : {}),
      });
      return be.read(o, 0, rows * s.outDim) as Float32Array;
    };
    const alone = (i: number) => run(1, xHost.slice(i * s.inDim, (i + 1) * s.inDim), outInit.slice(i * s.outDim, (i + 1) * s.outDim));
    const res = compareRows(`fused_matmul/${s.name}`, s.outDim, alone, (n) => run(n, xHost.slice(0, n * s.inDim), outInit.slice(0, n * s.outDim)), FM_ROW_COUNTS);
    const wv = bf16Values(wHost);
    let maxScaledErr = 0;
    for (let i = 0; i < ACC_ROWS; i++) {
      const e = fmScaledErr(s, alone(i), xHost.subarray(i * s.inDim, (i + 1) * s.inDim), wv, nwHost, biasHost, outInit.subarray(i * s.outDim, (i + 1) * s.outDim));
      maxScaledErr = Math.max(maxScaledErr, e);
    }
    return { ...res, ok: res.ok && maxScaledErr <= ACC_TOL, maxScaledErr };
  } catch (e) {
    return { case: `fused_matmul/${s.name}`, ok: false, rowCounts: ROW_COUNTS, mismatchedRows: -1, error: (e as Error).message };
  } finally {
    B.freeAll();
  }
}

// sharedBlocks > 0: every sequence's first sharedBlocks blocks are the same cache blocks (a shared
// prefix, as forks and prefix-cache hits have: a kernel that reads such keys once for several rows
// must still give each row its bits alone) and its context runs past them into blocks of its own.
function decoderLayersCase(be: DeviceBackend, kv: 'f32' | 'bf16', seed: number, nq = 16, sharedBlocks = 0): CaseResult {
  const bs = 16, shared = sharedBlocks * bs;
  const name = `decoder_layers/Qwen3-0.6B-like 2 layers, ${nq} q heads, ${kv} KV, ${shared ? `a ${shared}-key shared prefix, contexts ${shared + 1}..${shared + 300}` : 'contexts 1..~700'}`;
  const r = rng(seed);
  const B = new Bufs(be);
  const H = 1024, nkv = 8, hd = 128, I = 3072, layers = 2;
  const qkvOut = (nq + 2 * nkv) * hd, kvw = nkv * hd;
  const lens = Array.from({ length: MAX_ROWS }, (_, i) => (shared ? shared + 1 + ((i * 37 + 11) % 300) : 1 + ((i * 37 + 11) % 700)));
  const mbps = Math.ceil(Math.max(...lens) / bs) + 1;
  // Sequence q owns the blocks its context needs past the shared ones, from first[q] on (any
  // layout works: each row reads its own); the rest of its table row points at block 0, never read.
  const own = lens.map((n) => Math.ceil(n / bs) - sharedBlocks);
  const first: number[] = [];
  let numBlocks = sharedBlocks;
  for (const n of own) {
    first.push(numBlocks);
    numBlocks += n;
  }
  const blockOf = (q: number, j: number) => (j < sharedBlocks ? j : first[q] + j - sharedBlocks);
  const tables = Array.from({ length: MAX_ROWS * mbps }, (_, i) => {
    const q = Math.floor(i / mbps), j = i % mbps;
    return j < sharedBlocks + own[q] ? blockOf(q, j) : 0;
  });
  const slotOf = (q: number, p: number) => blockOf(q, Math.floor(p / bs)) * bs + (p % bs);
  try {
    const norm = (n: number) => normals(r, n, 0.1).map((v) => 1 + v);
    const L: DecoderLayerWeights[] = [];
    for (let l = 0; l < layers; l++) {
      const cache = (label: string) => (kv === 'f32' ? B.f32(normals(r, numBlocks * bs * kvw), label) : B.bf16(normals(r, numBlocks * bs * kvw), label));
      L.push({
        attnNorm: B.f32(norm(H), `L${l}.attnNorm`),
        qkv: B.bf16(normals(r, qkvOut * H, 1 / Math.sqrt(H)), `L${l}.qkv`),
        qNorm: B.f32(norm(hd), `L${l}.qNorm`),
        kNorm: B.f32(norm(hd), `L${l}.kNorm`),
        o: B.bf16(normals(r, H * nq * hd, 1 / Math.sqrt(nq * hd)), `L${l}.o`),
        mlpNorm: B.f32(norm(H), `L${l}.mlpNorm`),
        gateUp: B.bf16(normals(r, 2 * I * H, 1 / Math.sqrt(H)), `L${l}.gateUp`),
        down: B.bf16(normals(r, H * I, 1 / Math.sqrt(I)), `L${l}.down`),
        kCache: cache(`L${l}.k`),
        vCache: cache(`L${l}.v`),
      });
    }
    const inv = new Float32Array(hd / 2).map((_, i) => 1 / 1e6 ** ((2 * i) / hd));
    const xHost = normals(r, MAX_ROWS * H);
    const x = B.f32(MAX_ROWS * H, 'x');
    const qkv = B.f32(MAX_ROWS * qkvOut, 'qkv');
    const attn = B.f32(MAX_ROWS * nq * hd, 'attn');
    const mlp = B.f32(MAX_ROWS * I, 'mlp');
    const positions = B.i32(new Int32Array(MAX_ROWS), 'positions');
    const slots = B.i32(new Int32Array(MAX_ROWS), 'slots');
    const rowSeq = B.i32(new Int32Array(MAX_ROWS), 'rowSeq');
    const blockTables = B.i32(tables, 'blockTables');
    const invFreq = B.f32(inv, 'invFreq');
    const run = (seqs: number[]): Float32Array => {
      const rows = seqs.length;
      be.write(x, Float32Array.from(seqs.flatMap((q) => Array.from(xHost.subarray(q * H, (q + 1) * H)))));
      be.write(positions, Int32Array.from(seqs.map((q) => lens[q] - 1)));
      be.write(slots, Int32Array.from(seqs.map((q) => slotOf(q, lens[q] - 1))));
      be.write(rowSeq, Int32Array.from(seqs));
      be.run('decoder_layers', {
        x,
        qkv,
        attn,
        mlp,
        positions,
        slots,
        blockTables,
        rowSeq,
        invFreq,
        layers: L,
        rows,
        hidden: H,
        numHeads: nq,
        numKvHeads: nkv,
        headDim: hd,
        intermediate: I,
        blockSize: bs,
        maxBlocksPerSeq: mbps,
        eps: 1e-6,
        scale: 1 / Math.sqrt(hd),
      });
      return be.read(x, 0, rows * H) as Float32Array;
    };
    // Each row appends its key and value at its own slot: the same bits alone or together, so
    // the caches need no reset between runs.
    return compareRows(
      name,
      H,
      (i) => run([i]),
      (n) => run(Array.from({ length: n }, (_, i) => i)),
    );
  } catch (e) {
    return { case: name, ok: false, rowCounts: ROW_COUNTS, mismatchedRows: -1, error: (e as Error).message };
  } finally {
    B.freeAll();
  }
}

// Prompt chunks of several sequences in one op attention call (a batch-invariant prompt step of
// several prompts) against each chunk alone (oneSequence, as a step of one prompt passes it):
// every row's bits must be its bits alone. Chunks of at least 64 rows start anywhere in the call
// (the tile kernels cut each from its own first row); shorter ones and single rows take the
// split-KV kernel, as alone. Some chunks follow a cached prefix.
function promptAttentionCase(be: DeviceBackend, kv: 'f32' | 'bf16', seed: number): CaseResult {
  const name = `attention/prompt chunks of 9 sequences in one call vs alone, 16 q heads, 8 KV heads, ${kv} cache`;
  const r = rng(seed);
  const B = new Bufs(be);
  const nq = 16, nkv = 8, hd = 128, bs = 16;
  // [cached prefix, chunk rows] per sequence.
  const chunks: Array<[number, number]> = [[0, 65], [0, 64], [0, 10], [20, 130], [0, 1], [0, 200], [7, 63], [100, 300], [33, 129]];
  const lens = chunks.map(([c, n]) => c + n);
  const mbps = Math.ceil(Math.max(...lens) / bs);
  const first: number[] = [];
  let numBlocks = 0;
  for (const n of lens) {
    first.push(numBlocks);
    numBlocks += Math.ceil(n / bs);
  }
  const tables = Array.from({ length: chunks.length * mbps }, (_, i) => {
    const q = Math.floor(i / mbps), j = i % mbps;
    return j < Math.ceil(lens[q] / bs) ? first[q] + j : 0;
  });
  const rowsAll = chunks.reduce((a, [, n]) => a + n, 0);
  const qw = nq * hd;
  try {
    const cache = (label: string) => (kv === 'f32' ? B.f32(normals(r, numBlocks * bs * nkv * hd), label) : B.bf16(normals(r, numBlocks * bs * nkv * hd), label));
    const kCache = cache('k'), vCache = cache('v');
    const qHost = normals(r, rowsAll * qw);
    const q = B.f32(rowsAll * qw, 'q');
    const o = B.f32(rowsAll * qw, 'out');
    const positions = B.i32(new Int32Array(rowsAll), 'positions');
    const rowSeq = B.i32(new Int32Array(rowsAll), 'rowSeq');
    const blockTables = B.i32(tables, 'blockTables');
    const rowStart: number[] = [];
    let acc = 0;
    for (const [, n] of chunks) {
      rowStart.push(acc);
      acc += n;
    }
    const run = (seqs: number[], oneSequence: boolean): Float32Array => {
      const ps: number[] = [], ss: number[] = [];
      const qs = new Float32Array(rowsAll * qw);
      for (const s of seqs) {
        const [c, n] = chunks[s];
        qs.set(qHost.subarray(rowStart[s] * qw, (rowStart[s] + n) * qw), ps.length * qw);
        for (let i = 0; i < n; i++) {
          ps.push(c + i);
          ss.push(s);
        }
      }
      const rows = ps.length;
      be.write(q, qs.subarray(0, rows * qw));
      be.write(positions, Int32Array.from(ps));
      be.write(rowSeq, Int32Array.from(ss));
      be.run('attention', { q, kCache, vCache, out: o, blockTables, rowSeq, positions, rows, numHeads: nq, numKvHeads: nkv, headDim: hd, blockSize: bs, maxBlocksPerSeq: mbps, qRowStride: qw, qOffset: 0, scale: 1 / Math.sqrt(hd), ...(oneSequence ? { oneSequence: true } : {}) });
      return be.read(o, 0, rows * qw) as Float32Array;
    };
    const alone = chunks.map((_, s) => run([s], true));
    // Together in the listed order, then reversed (every chunk at another row offset).
    let bad = 0;
    const firstBad: Mismatch[] = [];
    for (const order of [chunks.map((_, s) => s), chunks.map((_, s) => chunks.length - 1 - s)]) {
      const got = run(order, false);
      let at = 0;
      for (const s of order) {
        const n = chunks[s][1];
        for (let i = 0; i < n; i++) {
          const d = bitsEqual(got.subarray((at + i) * qw, (at + i + 1) * qw), alone[s].subarray(i * qw, (i + 1) * qw));
          if (d > 0) {
            bad++;
            if (firstBad.length < 4) firstBad.push({ rows: rowsAll, row: at + i, differing: d });
          }
        }
        at += n;
      }
    }
    return { case: name, ok: bad === 0, rowCounts: [rowsAll], mismatchedRows: bad, ...(firstBad.length ? { first: firstBad } : {}) };
  } catch (e) {
    return { case: name, ok: false, rowCounts: [rowsAll], mismatchedRows: -1, error: (e as Error).message };
  } finally {
    B.freeAll();
  }
}

const FM: FmShape[] = [
  { name: 'qkv 0.6B (norm) 1024->4096', inDim: 1024, outDim: 4096, norm: true },
  { name: 'gate_up 0.6B (norm, glu) 1024->2x3072', inDim: 1024, outDim: 3072, norm: true, glu: true },
  { name: 'o 0.6B (accumulate, split) 2048->1024', inDim: 2048, outDim: 1024, accumulate: true },
  { name: 'down 0.6B (accumulate, split) 3072->1024', inDim: 3072, outDim: 1024, accumulate: true },
  { name: 'qkv 8B (norm past shared memory) 4096->6144', inDim: 4096, outDim: 6144, norm: true },
  { name: 'lm head 1024->32768', inDim: 1024, outDim: 32768 },
  { name: 'tail 1040->200 (bias, accumulate; inDim % 64 = 16, a partial output tile)', inDim: 1040, outDim: 200, bias: true, accumulate: true },
];

function suite(be: DeviceBackend): { passed: number; failed: number; results: CaseResult[]; seconds: number } {
  const t0 = performance.now();
  const results: CaseResult[] = [];
  FM.forEach((s, i) => results.push(fusedMatmulCase(be, s, 100 + i)));
  results.push(decoderLayersCase(be, 'f32', 7));
  results.push(decoderLayersCase(be, 'bf16', 8));
  // Rows reading a shared prefix, two and four q heads a KV head (the 0.6B's and the 8B's groups).
  results.push(decoderLayersCase(be, 'bf16', 9, 16, 40));
  results.push(decoderLayersCase(be, 'bf16', 10, 32, 40));
  results.push(promptAttentionCase(be, 'f32', 11));
  results.push(promptAttentionCase(be, 'bf16', 12));
  for (const c of results) {
    const acc = c.maxScaledErr === undefined ? '' : `, max error ${c.maxScaledErr.toExponential(2)} of sum |terms|${c.maxScaledErr > ACC_TOL ? ` (> ${ACC_TOL})` : ''}`;
    console.log(`[invariance] ${c.ok ? 'ok  ' : 'FAIL'} ${c.case}: ${c.mismatchedRows} rows differ${acc}${c.error ? ` (${c.error})` : ''}`);
  }
  return { passed: results.filter((c) => c.ok).length, failed: results.filter((c) => !c.ok).length, results, seconds: (performance.now() - t0) / 1000 };
}

const probe = probeCuda();
if (!probe.available) {
  writeFileSync(path.join(out, 'batch_invariance.json'), JSON.stringify({ probe }, null, 1));
  console.error(`CUDA unavailable: ${probe.reason}`);
  process.exit(1);
}
const inv = createCudaBackend({ deviceArenaBytes: 4 * 2 ** 30, batchInvariant: true });
console.log('[invariance] batchInvariant: true');
const invariant = { capabilities: { batchInvariant: inv.capabilities.batchInvariant, matmulPrecision: inv.capabilities.matmulPrecision }, ...suite(inv) };
// The cuBLASLt algorithm pinned per weight shape (its split-K and reduction scheme among them).
const pins = inv.pinnedGemms();
console.log(`[invariance] pins: ${pins || '(none)'}`);
inv.dispose();
// NERVA_INVARIANCE_DEFAULT=0 skips the informational run on the default backend.
let byDefault: ReturnType<typeof suite> | undefined;
if (process.env.NERVA_INVARIANCE_DEFAULT !== '0') {
  const def = createCudaBackend({ deviceArenaBytes: 4 * 2 ** 30, batchInvariant: false });
  console.log('[invariance] default backend (informational)');
  byDefault = suite(def);
  def.dispose();
}
// NERVA_INVARIANCE_TIME=1: ms per fused_matmul call of the Qwen3-8B and 0.6B decode shapes at 1..128
// rows on a batchInvariant backend (the weights' GB/s and the FMA rate), once per batch-invariant
// matmul path: cuBLASLt with pinned algorithms (the default) and k_gemm_bi (what runs without
// cuBLAS: gemm 'gemv'), to see where a batched batch-invariant decode step goes. Informational;
// weights left uninitialized (timing only).
let timing: Record<string, unknown>[] | undefined;
if (process.env.NERVA_INVARIANCE_TIME === '1') {
  timing = [];
  const shapes: FmShape[] = [
    { name: 'qkv 8B', inDim: 4096, outDim: 6144, norm: true },
    { name: 'o 8B', inDim: 4096, outDim: 4096, accumulate: true },
    { name: 'gate_up 8B', inDim: 4096, outDim: 12288, norm: true, glu: true },
    { name: 'down 8B', inDim: 12288, outDim: 4096, accumulate: true },
    { name: 'lm head 8B', inDim: 4096, outDim: 151936 },
    { name: 'qkv 0.6B', inDim: 1024, outDim: 4096, norm: true },
    { name: 'o 0.6B', inDim: 2048, outDim: 1024, accumulate: true },
    { name: 'gate_up 0.6B', inDim: 1024, outDim: 3072, norm: true, glu: true },
    { name: 'down 0.6B', inDim: 3072, outDim: 1024, accumulate: true },
    { name: 'lm head 0.6B', inDim: 1024, outDim: 151936 },
  ];
  const paths = [
    { path: 'cublaslt-pinned', opts: {} },
    { path: 'k_gemm_bi', opts: { gemm: 'gemv' as const } },
  ];
  for (const p of paths) {
    const be = createCudaBackend({ deviceArenaBytes: 4 * 2 ** 30, batchInvariant: true, ...p.opts });
    for (const s of shapes) {
      const B = new Bufs(be);
      const nOut = s.glu ? 2 : 1;
      const w = be.alloc({ dtype: 'bf16', length: nOut * s.outDim * s.inDim, label: 'w' });
      const x = B.f32(normals(rng(1), 128 * s.inDim), 'x');
      const nw = s.norm ? B.f32(new Float32Array(s.inDim).fill(1), 'nw') : undefined;
      const o = B.f32(128 * s.outDim, 'out');
      for (const rows of [1, 8, 16, 32, 64, 128]) {
        const call = () =>
          be.run('fused_matmul', { x, weight: w, out: o, rows, inDim: s.inDim, outDim: s.outDim, ...(nw ? { normWeight: nw, eps: 1e-6 } : {}), ...(s.glu ? { glu: true } : {}), ...(s.accumulate ? { accumulate: true } : {}) });
        for (let i = 0; i < 3; i++) call();
        be.synchronize('debug');
        const reps = 20;
        const t0 = performance.now();
        for (let i = 0; i < reps; i++) call();
        be.synchronize('debug');
        const ms = (performance.now() - t0) / reps;
        const wBytes = nOut * s.outDim * s.inDim * 2;
        const t = { path: p.path, shape: s.name, rows, ms: Math.round(ms * 1000) / 1000, weight_gbps: Math.round(wBytes / (ms * 1e6)), tfma_s: Math.round(((rows * nOut * s.outDim * s.inDim) / (ms * 1e9)) * 100) / 100 };
        console.log(`[invariance] time ${JSON.stringify(t)}`);
        timing.push(t);
      }
      be.free(w);
      B.freeAll();
    }
    be.dispose();
  }
}
writeFileSync(path.join(out, 'batch_invariance.json'), JSON.stringify({ probe, rowCounts: ROW_COUNTS, invariant, pins, default: byDefault, timing }, null, 1));
process.exit(invariant.failed === 0 && invariant.capabilities.batchInvariant === true ? 0 : 1);
