// GPU machine: what the conformance suite does not reach. cuBLAS GEMMs (bf16 weights, many rows)
// against the CPU, the sampler at a real vocabulary, graph capture/replay with device-side
// positions and the pinned token ring, the hot-path guard, OOM, and bandwidth: copy (the
// roofline figure) and the GEMV kernel on model-shaped matrices. Writes $OUT/checks.json.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { f32ToBf16, type DeviceBackend, type DeviceBuffer } from '@nerva/core';
import { createCpuBackend } from '@nerva/cpu-backend';
import { createCudaBackend, CudaOutOfMemoryError, type CudaBackend } from '@nerva/cuda-backend';

const out = process.env.OUT ?? '.';
const results: Record<string, unknown> = {};
let failed = 0;

function check(name: string, fn: () => unknown): void {
  try {
    const r = fn();
    results[name] = r;
    const ok = (r as { ok?: boolean })?.ok;
    if (ok === false) failed++;
    console.log(`${ok === false ? 'FAIL' : 'ok  '} ${name} ${JSON.stringify(r).slice(0, 300)}`);
  } catch (e) {
    failed++;
    results[name] = { ok: false, error: `${(e as Error).name}: ${(e as Error).message}` };
    console.log(`FAIL ${name}: ${(e as Error).stack}`);
  }
}

let seed = 12345;
function rand(): number {
  seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
  return seed / 2 ** 32;
}
function normals(n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand()) * scale;
  return a;
}
const toBf16 = (a: Float32Array): Uint16Array => Uint16Array.from(a, f32ToBf16);

function upload(be: DeviceBackend, dtype: 'f32' | 'bf16' | 'i32', data: Float32Array | Int32Array | Uint16Array, tier?: 'pinned'): DeviceBuffer {
  const b = be.alloc({ dtype, length: data.length, ...(tier ? { tier } : {}) });
  be.write(b, data);
  return b;
}

function relErr(got: ArrayLike<number>, ref: ArrayLike<number>): number {
  let m = 0;
  let e = 0;
  for (let i = 0; i < ref.length; i++) {
    m = Math.max(m, Math.abs(ref[i]));
    e = Math.max(e, Math.abs(got[i] - ref[i]));
  }
  return e / m;
}

const cuda = createCudaBackend({ deviceArenaBytes: 8 * 2 ** 30 });
const cudaBf16 = createCudaBackend({ deviceArenaBytes: 2 ** 30, gemm: 'bf16' });
const cpu = createCpuBackend();
results.device = cuda.info();

function gemmCase(be: CudaBackend, rows: number, inDim: number, outDim: number, tol: number) {
  const w = toBf16(normals(outDim * inDim, 1 / Math.sqrt(inDim)));
  const x = normals(rows * inDim);
  const bias = normals(outDim);
  const res: number[][] = [];
  const outs: Float32Array[] = [];
  for (const b of [be, cpu] as DeviceBackend[]) {
    const bw = upload(b, 'bf16', w), bx = upload(b, 'f32', x), bb = upload(b, 'f32', bias);
    const bo = b.alloc({ dtype: 'f32', length: rows * outDim });
    b.run('matmul', { x: bx, weight: bw, out: bo, rows, inDim, outDim, bias: bb });
    outs.push(b.read(bo) as Float32Array);
    for (const z of [bw, bx, bb, bo]) b.free(z);
  }
  const rel = relErr(outs[0], outs[1]);
  res.push([rows, rel]);
  return { ok: rel <= tol, rows, inDim, outDim, relErr: rel, tol, gemm: be.info().gemm };
}

check('gemm_split_bf16_64x1024x3072', () => gemmCase(cuda, 64, 1024, 3072, cuda.capabilities.precision.relTol));
check('gemm_split_bf16_300x2048x512', () => gemmCase(cuda, 300, 2048, 512, cuda.capabilities.precision.relTol));
check('gemm_bf16_64x1024x3072', () => gemmCase(cudaBf16, 64, 1024, 3072, cudaBf16.capabilities.precision.relTol));
check('gemv_rows_3_4096x1000_splitk', () => gemmCase(cuda, 3, 4096, 1000, cuda.capabilities.precision.relTol));
check('gemv_rows_1_2048x1024_splitk', () => gemmCase(cuda, 1, 2048, 1024, cuda.capabilities.precision.relTol));
check('gemv_rows_8_1024x3000', () => gemmCase(cuda, 8, 1024, 3000, cuda.capabilities.precision.relTol));

check('sample_vocab_151936', () => {
  const vocab = 151936;
  const params = [
    [0.7, 0, 1, 0],
    [1, 50, 0.9, 0],
    [1.2, 0, 0.95, 0.05],
    [0, 0, 1, 0],
    [1, 0, 1, 0],
  ];
  const rows = params.length;
  const logits = normals(rows * vocab, 3);
  const rng = new Int32Array(rows * 2);
  for (let r = 0; r < rows; r++) {
    rng[2 * r] = (rand() * 2 ** 31) | 0;
    rng[2 * r + 1] = r * 7;
  }
  const draws = 4;
  const got: number[][] = [[], []];
  let ms = 0;
  [cuda, cpu].forEach((b: DeviceBackend, k) => {
    const bl = upload(b, 'f32', logits), bp = upload(b, 'f32', Float32Array.from(params.flat())), br = upload(b, 'i32', rng);
    const bo = b.alloc({ dtype: 'i32', length: rows });
    const t0 = performance.now();
    for (let d = 0; d < draws; d++) {
      b.run('sample', { logits: bl, params: bp, rng: br, out: bo, rows, vocab });
      got[k].push(...(b.read(bo) as Int32Array));
    }
    if (k === 0) ms = (performance.now() - t0) / draws;
    for (const z of [bl, bp, br, bo]) b.free(z);
  });
  const mism = got[0].filter((v, i) => v !== got[1][i]).length;
  return { ok: mism === 0, mismatches: mism, draws: got[0].length, msPerCall: ms, cuda: got[0], cpu: got[1] };
});

check('graph_capture_ring', () => {
  const be = cuda;
  const blockSize = 4;
  const mbps = 8;
  const tables = Int32Array.from({ length: mbps }, (_, i) => mbps - 1 - i);
  const pos = upload(be, 'i32', Int32Array.from([2]));
  const slots = upload(be, 'i32', Int32Array.from([-1]));
  const bt = upload(be, 'i32', tables);
  const rowSeq = upload(be, 'i32', Int32Array.from([0]));
  const ring = upload(be, 'i32', new Int32Array(16).fill(-1), 'pinned');
  const cursor = upload(be, 'i32', Int32Array.from([0]), 'pinned');
  const s = be.createStream();
  const before = be.stats();
  be.beginCapture(s);
  be.run('advance_positions', { positions: pos, slots, blockTables: bt, rowSeq, rows: 1, blockSize, maxBlocksPerSeq: mbps }, s);
  be.run('ring_push', { src: slots, ring, cursor, rows: 1, capacity: 16 }, s);
  const g = be.endCapture(s);
  const mid = be.stats();
  be.setHotPath(true);
  const replays = 10;
  for (let i = 0; i < replays; i++) be.replay(g, s);
  be.synchronize('policy', s);
  let rejected = false;
  try {
    be.alloc({ dtype: 'f32', length: 4 });
  } catch {
    rejected = true;
  }
  be.setHotPath(false);
  const after = be.stats();
  const seen = Array.from(be.peek(ring, 0, replays));
  const cur = be.peek(cursor)[0];
  const expect = Array.from({ length: replays }, (_, i) => {
    const p = 3 + i;
    return tables[Math.floor(p / blockSize)] * blockSize + (p % blockSize);
  });
  be.destroyGraph(g);
  be.destroyStream(s);
  for (const z of [pos, slots, bt, rowSeq, ring, cursor]) be.free(z);
  const ok =
    JSON.stringify(seen) === JSON.stringify(expect) &&
    cur === replays &&
    g.nodes === 2 &&
    after.graphReplays - mid.graphReplays === replays &&
    after.launches === mid.launches &&
    mid.launches === before.launches &&
    rejected &&
    after.hotPathAllocations === before.hotPathAllocations + 1 &&
    after.allocCalls === before.allocCalls;
  return { ok, nodes: g.nodes, seen, expect, cursor: cur, replays: after.graphReplays - mid.graphReplays, launchesDuringReplay: after.launches - mid.launches, rejected };
});

check('oom_typed', () => {
  try {
    cuda.alloc({ dtype: 'f32', length: 3 * 2 ** 30 });
    return { ok: false, error: 'no error' };
  } catch (e) {
    return { ok: e instanceof CudaOutOfMemoryError, error: (e as Error).message };
  }
});

check('bad_args_typed', () => {
  const a = cuda.alloc({ dtype: 'f32', length: 4 });
  try {
    cuda.run('add', { a, b: a, out: a, length: 5 });
    return { ok: false };
  } catch (e) {
    return { ok: (e as Error).name === 'CudaArgumentError', error: (e as Error).message };
  } finally {
    cuda.free(a);
  }
});

let copyGBs = 0;
check('copy_bandwidth', () => {
  copyGBs = cuda.measureCopyBandwidth(2 ** 30, 20);
  return { ok: copyGBs > 0, GBps: copyGBs };
});

check('gemv_bandwidth', () => {
  // [outDim, inDim] of Qwen3-0.6B / 8B projections (fused qkv and gate_up) and LM heads.
  const shapes: Array<[string, number, number]> = [
    ['0.6b qkv 4096x1024', 4096, 1024],
    ['0.6b o 1024x2048', 1024, 2048],
    ['0.6b gate_up 6144x1024', 6144, 1024],
    ['0.6b down 1024x3072', 1024, 3072],
    ['0.6b lm_head 151936x1024', 151936, 1024],
    ['8b qkv 6144x4096', 6144, 4096],
    ['8b gate_up 24576x4096', 24576, 4096],
    ['8b down 4096x12288', 4096, 12288],
    ['8b lm_head 151936x4096', 151936, 4096],
  ];
  const rows: unknown[] = [];
  const s = cuda.createStream();
  const e0 = cuda.createEvent(), e1 = cuda.createEvent();
  for (const [name, outDim, inDim] of shapes) {
    // Enough copies of the matrix to overflow the 50 MB L2, cycled, so every call streams from HBM.
    const bytes = outDim * inDim * 2;
    const copies = Math.max(1, Math.ceil(256e6 / bytes));
    const ws = Array.from({ length: copies }, () => cuda.alloc({ dtype: 'bf16', length: outDim * inDim }));
    const x = upload(cuda, 'f32', normals(inDim));
    const o = cuda.alloc({ dtype: 'f32', length: outDim });
    // Several launches in one graph: the timing is the kernel's, not Node's launch overhead.
    const reps = Math.max(copies, Math.min(200, Math.ceil(2e9 / bytes)));
    cuda.beginCapture(s);
    for (let i = 0; i < reps; i++) cuda.run('matmul', { x, weight: ws[i % copies], out: o, rows: 1, inDim, outDim }, s);
    const g = cuda.endCapture(s);
    cuda.replay(g, s);
    cuda.record(e0, s);
    cuda.replay(g, s);
    cuda.record(e1, s);
    cuda.synchronize('debug', s);
    const ms = cuda.elapsedMs(e0, e1);
    const gbps = (bytes * reps) / (ms * 1e-3) / 1e9;
    rows.push({ name, usPerCall: (ms * 1000) / reps, GBps: gbps, fractionOfCopy: copyGBs ? gbps / copyGBs : null });
    cuda.destroyGraph(g);
    for (const z of [...ws, x, o]) cuda.free(z);
  }
  cuda.destroyEvent(e0);
  cuda.destroyEvent(e1);
  cuda.destroyStream(s);
  return { copyGBps: copyGBs, shapes: rows };
});

check('attention_decode_timing', () => {
  const H = 32, KVH = 8, hd = 128, bs = 16, ctx = 4096, mbps = ctx / bs;
  const kc = cuda.alloc({ dtype: 'bf16', length: ctx * KVH * hd });
  const vc = cuda.alloc({ dtype: 'bf16', length: ctx * KVH * hd });
  const q = upload(cuda, 'f32', normals(H * hd));
  const o = cuda.alloc({ dtype: 'f32', length: H * hd });
  const bt = upload(cuda, 'i32', Int32Array.from({ length: mbps }, (_, i) => i));
  const rs = upload(cuda, 'i32', Int32Array.from([0]));
  const ps = upload(cuda, 'i32', Int32Array.from([ctx - 1]));
  const s = cuda.createStream();
  const e0 = cuda.createEvent(), e1 = cuda.createEvent();
  const reps = 50;
  cuda.beginCapture(s);
  for (let i = 0; i < reps; i++)
    cuda.run('attention', { q, kCache: kc, vCache: vc, out: o, blockTables: bt, rowSeq: rs, positions: ps, rows: 1, numHeads: H, numKvHeads: KVH, headDim: hd, blockSize: bs, maxBlocksPerSeq: mbps, qRowStride: H * hd, qOffset: 0, scale: 0.088 }, s);
  const g = cuda.endCapture(s);
  cuda.replay(g, s);
  cuda.record(e0, s);
  cuda.replay(g, s);
  cuda.record(e1, s);
  cuda.synchronize('debug', s);
  const ms = cuda.elapsedMs(e0, e1) / reps;
  const bytes = 2 * ctx * KVH * hd * 2;
  cuda.destroyGraph(g);
  for (const z of [kc, vc, q, o, bt, rs, ps]) cuda.free(z);
  return { context: ctx, usPerCall: ms * 1000, kvGBps: bytes / (ms * 1e-3) / 1e9 };
});

check('leaks_and_counters', () => {
  const st = cuda.stats();
  return { ok: st.liveBuffers === 0 && st.liveBytes === 0, stats: st };
});

cuda.dispose();
cudaBf16.dispose();
writeFileSync(path.join(out, 'checks.json'), JSON.stringify({ failed, results }, null, 1));
console.log(`checks: ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
