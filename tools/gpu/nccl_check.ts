// GPU machine: NCCL through the CUDA addon (packages/cuda-backend/src/nccl.ts). Loads
// libnccl.so.2 (version and path), makes a one-rank communicator (ncclCommInitRank, nranks 1)
// and moves a buffer to itself with a grouped send/recv, then, with 2+ GPUs, a two-rank
// communicator with ncclCommInitAll: GPU 0 sends an f32 buffer and a bf16 range to GPU 1 on
// dedicated streams, the bytes are checked, and a 64 MiB transfer is timed. Prints one JSON line
// and writes it to $OUT/nccl.json.
//
// Order matters with two backends in one process: the addon's Context calls do not select their
// device (only its constructor and the NCCL calls do), so everything that needs device 0 current
// (staged writes, stream creation) happens before the second backend is created.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { createCudaBackend, loadNccl, NcclCommunicator, probeCuda, type CudaBackend } from '@nerva/cuda-backend';

const out = process.env.OUT ?? '.';
const result: Record<string, unknown> = { check: 'nccl', ok: false };
const errors: string[] = [];

function finish(): never {
  result.ok = errors.length === 0;
  if (errors.length) result.errors = errors;
  const line = JSON.stringify(result);
  writeFileSync(path.join(out, 'nccl.json'), line + '\n');
  console.log(line);
  process.exit(errors.length === 0 ? 0 : 1);
}

function step<T>(name: string, fn: () => T): T | undefined {
  try {
    return fn();
  } catch (e) {
    errors.push(`${name}: ${(e as Error).name}: ${(e as Error).message}`);
    console.error(`[nccl] ${name} FAILED: ${(e as Error).stack}`);
    return undefined;
  }
}

/** First index where got and want differ, or -1. */
function firstMismatch(got: ArrayLike<number>, want: ArrayLike<number>): number {
  if (got.length !== want.length) return Math.min(got.length, want.length);
  for (let i = 0; i < want.length; i++) if (got[i] !== want[i]) return i;
  return -1;
}

const backendOptions = (device: number) => ({
  device,
  deviceArenaBytes: 512 * 2 ** 20,
  pinnedArenaBytes: 2 ** 20,
  workspaceBytes: 16 * 2 ** 20,
  cublasWorkspaceBytes: 0,
  gemm: 'gemv' as const,
});

const status = loadNccl();
result.nccl = status;
console.error(`[nccl] ${status.available ? `NCCL ${status.version} at ${status.path}` : `NCCL unavailable: ${status.reason}`}`);
if (!status.available) {
  errors.push(`loadNccl: ${status.reason}`);
  finish();
}
const probe = probeCuda();
result.devices = probe.deviceCount ?? 0;
if (!probe.available) {
  errors.push(`probeCuda: ${probe.reason}`);
  finish();
}

const N = 4099; // f32 elements: odd, so no transfer is a round number of bytes
const M = 1000; // bf16 elements, sent as the range [8, M) into [16, 16 + M - 8)
const pattern = Float32Array.from({ length: N }, (_, i) => i * 0.5 - 7);
const halfPattern = Float32Array.from({ length: M }, (_, i) => (i % 200) - 100); // exact in bf16

const a: CudaBackend = createCudaBackend(backendOptions(0));

// One rank: ncclCommInitRank(nranks 1, rank 0), then a grouped send to itself and receive.
result.oneRank = step('oneRank', () => {
  const c = NcclCommunicator.init([a]);
  const info = c.info();
  const s = a.createStream();
  const x = a.alloc({ dtype: 'f32', length: N });
  const y = a.alloc({ dtype: 'f32', length: N });
  a.write(x, pattern);
  a.write(y, new Float32Array(N));
  a.synchronize('debug');
  c.group(() => {
    c.send(x, 0, { stream: s });
    c.recv(y, 0, { stream: s });
  });
  a.synchronize('debug', s);
  const mismatch = firstMismatch(a.read(y), pattern);
  c.destroy();
  a.free(x);
  a.free(y);
  a.destroyStream(s);
  if (mismatch >= 0) throw new Error(`self send/recv: element ${mismatch} differs`);
  return { ok: true, info, elements: N };
});

const devices = probe.deviceCount ?? 0;
if (devices < 2) {
  result.twoRank = { skipped: `${devices} GPU visible` };
} else {
  result.twoRank = step('twoRank', () => {
    // Device 0's side first, while device 0 is current.
    const sa = a.createStream();
    const x0 = a.alloc({ dtype: 'f32', length: N });
    const h0 = a.alloc({ dtype: 'bf16', length: M });
    a.write(x0, pattern);
    a.write(h0, halfPattern);
    a.synchronize('debug');
    const bigElems = 16 * 2 ** 20; // 64 MiB of f32
    const big0 = a.alloc({ dtype: 'f32', length: bigElems });

    const b = createCudaBackend(backendOptions(1));
    const sb = b.createStream();
    const y1 = b.alloc({ dtype: 'f32', length: N });
    const h1 = b.alloc({ dtype: 'bf16', length: M + 8 });
    const big1 = b.alloc({ dtype: 'f32', length: bigElems });
    b.write(y1, new Float32Array(N));
    b.write(h1, new Float32Array(M + 8));
    b.synchronize('debug');

    const c = NcclCommunicator.initAll([a, b]);
    const infos = [c.info(0), c.info(1)];
    // Transfers between one pair of ranks match in the order they are issued.
    c.group(() => {
      c.send(x0, 1, { stream: sa });
      c.send(h0, 1, { stream: sa, offset: 8, length: M - 8 });
      c.recv(y1, 0, { stream: sb });
      c.recv(h1, 0, { stream: sb, offset: 16, length: M - 8 });
    });
    a.synchronize('debug', sa);
    b.synchronize('debug', sb);
    const f32Mismatch = firstMismatch(b.read(y1), pattern);
    const gotHalf = b.read(h1);
    const wantHalf = new Float32Array(M + 8);
    wantHalf.set(halfPattern.subarray(8), 16);
    const bf16Mismatch = firstMismatch(gotHalf, wantHalf);

    const transfer = () =>
      c.group(() => {
        c.send(big0, 1, { stream: sa });
        c.recv(big1, 0, { stream: sb });
      });
    transfer();
    a.synchronize('debug', sa);
    b.synchronize('debug', sb);
    const iters = 10;
    const t0 = performance.now();
    for (let i = 0; i < iters; i++) transfer();
    a.synchronize('debug', sa);
    b.synchronize('debug', sb);
    const ms = (performance.now() - t0) / iters;

    c.destroy();
    b.dispose();
    if (f32Mismatch >= 0) throw new Error(`GPU 0 -> 1 f32: element ${f32Mismatch} differs`);
    if (bf16Mismatch >= 0) throw new Error(`GPU 0 -> 1 bf16 range: element ${bf16Mismatch} differs`);
    return {
      ok: true,
      method: status.initAll ? 'ncclCommInitAll' : 'ncclCommInitRank x2 in a group',
      infos,
      elements: { f32: N, bf16: M - 8 },
      p2p: { bytes: bigElems * 4, msPerTransfer: ms, GBps: (bigElems * 4) / (ms * 1e-3) / 1e9 },
    };
  });
}

a.dispose();
finish();
