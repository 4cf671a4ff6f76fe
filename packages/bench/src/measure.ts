import type { DeviceBackend, DeviceBuffer, MatmulPrecision } from '@nerva/core';
import { type BackendOptions, selectBackend } from '@nerva/engine';

/**
 * Copy bandwidth of the backend's compute tier, bytes read + written per second, measured with
 * the contract's own copy and events (the ceiling a decode step that streams weights can reach).
 */
export function measureCopyBandwidth(backend: DeviceBackend, bytes = 256 * 2 ** 20, iters = 10): number {
  const length = Math.floor(bytes / 4);
  const a = backend.alloc({ dtype: 'f32', length, usage: 'workspace', label: 'bench.copy.src' });
  const b = backend.alloc({ dtype: 'f32', length, usage: 'workspace', label: 'bench.copy.dst' });
  const e0 = backend.createEvent();
  const e1 = backend.createEvent();
  try {
    backend.copy(b, a, length); // warm-up
    backend.synchronize('debug');
    backend.record(e0);
    for (let i = 0; i < iters; i++) backend.copy(b, a, length);
    backend.record(e1);
    backend.synchronize('debug');
    const ms = backend.elapsedMs(e0, e1);
    return (2 * length * 4 * iters) / (ms / 1000);
  } finally {
    backend.destroyEvent(e0);
    backend.destroyEvent(e1);
    backend.free(a);
    backend.free(b);
  }
}

/** One GEMM shape: out[M, N] = x[M, K] . W[N, K]^T (activations f32, weights bf16, out f32). */
export interface GemmShape {
  m: number;
  k: number;
  n: number;
}

/** The rate of one shape: 2·M·N·K FLOPs per product over the device time of `iters` products. */
export interface GemmShapeRate extends GemmShape {
  tflops: number;
  /** Device milliseconds of one product (the mean of the timed ones). */
  ms: number;
  iters: number;
}

export interface GemmRate {
  /** The best rate over the shapes, TFLOP/s: the reference an MFU is taken against. */
  tflops: number;
  shapes: GemmShapeRate[];
  /** Matmul precision of the backend the products ran on (its capabilities). */
  matmulPrecision: MatmulPrecision;
  weightDtype: 'bf16';
}

/** The projections of a Qwen3-8B-sized layer at a 4096-token prefill: the fused gate/up shape and a square one. */
export const GPU_GEMM_SHAPES: readonly GemmShape[] = Object.freeze([
  { m: 4096, k: 4096, n: 12288 },
  { m: 4096, k: 4096, n: 4096 },
]);

/** Shapes small enough for the CPU backend's plain-TypeScript matmul (tens of ms a product). */
export const CPU_GEMM_SHAPES: readonly GemmShape[] = Object.freeze([
  { m: 64, k: 256, n: 768 },
  { m: 64, k: 256, n: 256 },
]);

/** The default shapes for a backend: GPU-sized unless it computes in host memory. */
export function defaultGemmShapes(backend: DeviceBackend): readonly GemmShape[] {
  return backend.capabilities.deviceKind === 'cpu' ? CPU_GEMM_SHAPES : GPU_GEMM_SHAPES;
}

/** Parse "MxKxN[,MxKxN...]" (e.g. 4096x4096x12288,4096x4096x4096) into shapes; a bad entry is an error naming it. */
export function parseGemmShapes(v: string): GemmShape[] {
  const shapes = v.split(',').map((part) => {
    const dims = part.trim().split('x');
    const nums = dims.map((d) => Number(d));
    if (dims.length !== 3 || nums.some((x) => !Number.isSafeInteger(x) || x < 1)) throw new RangeError(`GEMM shape "${part}" must be MxKxN with positive integers, e.g. 4096x4096x12288`);
    return { m: nums[0], k: nums[1], n: nums[2] };
  });
  if (shapes.length === 0) throw new RangeError('at least one GEMM shape is needed');
  return shapes;
}

/** Fill `buf` with deterministic values in [-0.5, 0.5) through chunked writes (no full-size host copy). */
function fill(backend: DeviceBackend, buf: DeviceBuffer, seed: number): void {
  const chunk = Math.min(buf.length, 1 << 20);
  const host = new Float32Array(chunk);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < chunk; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    host[i] = x / 2 ** 32 - 0.5;
  }
  for (let off = 0; off < buf.length; off += chunk) backend.write(buf, host.subarray(0, Math.min(chunk, buf.length - off)), off);
}

/**
 * The many-row matmul rate of a backend, through the contract only: for each shape, op `matmul`
 * with rows = M over bf16 weights [N, K] and f32 activations [M, K] (the engine's prefill
 * projections), one warm-up product, one timed to size the run, then enough products for at least
 * `minMs` of device time between two events. The backend's own matmul precision applies (on CUDA
 * 'exact' runs two split-bf16 GEMMs, 'bf16' one), so create it with the precision the engine
 * runs. Returns TFLOP/s per shape (2·M·N·K per product) and the best of them. Buffers are freed.
 */
export function measureGemmRate(backend: DeviceBackend, shapes: readonly GemmShape[] = defaultGemmShapes(backend), minMs = 200): GemmRate {
  if (shapes.length === 0) throw new RangeError('measureGemmRate: at least one shape is needed');
  if (!(minMs > 0)) throw new RangeError(`measureGemmRate: minMs must be positive, got ${minMs}`);
  const out: GemmShapeRate[] = [];
  for (const { m, k, n } of shapes) {
    for (const [name, v] of Object.entries({ m, k, n })) {
      if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`measureGemmRate: ${name} must be a positive integer, got ${v}`);
    }
    const bufs: DeviceBuffer[] = [];
    const e0 = backend.createEvent();
    const e1 = backend.createEvent();
    try {
      const x = backend.alloc({ dtype: 'f32', length: m * k, usage: 'workspace', label: 'bench.gemm.x' });
      bufs.push(x);
      const w = backend.alloc({ dtype: 'bf16', length: n * k, usage: 'workspace', label: 'bench.gemm.w' });
      bufs.push(w);
      const y = backend.alloc({ dtype: 'f32', length: m * n, usage: 'workspace', label: 'bench.gemm.out' });
      bufs.push(y);
      fill(backend, x, 0x9e3779b9);
      fill(backend, w, 0x85ebca6b);
      const args = { x, weight: w, out: y, rows: m, inDim: k, outDim: n };
      const timed = (iters: number): number => {
        backend.synchronize('debug');
        backend.record(e0);
        for (let i = 0; i < iters; i++) backend.run('matmul', args);
        backend.record(e1);
        backend.synchronize('debug');
        return backend.elapsedMs(e0, e1);
      };
      timed(1); // warm-up: first-use costs (GEMM heuristics, page faults)
      const one = Math.max(timed(1), 1e-3);
      const iters = Math.max(3, Math.ceil(minMs / one));
      const ms = timed(iters) / iters;
      out.push({ m, k, n, tflops: (2 * m * n * k) / (ms / 1000) / 1e12, ms, iters });
    } finally {
      backend.destroyEvent(e0);
      backend.destroyEvent(e1);
      for (const b of bufs) backend.free(b);
    }
  }
  return { tflops: Math.max(...out.map((r) => r.tflops)), shapes: out, matmulPrecision: backend.capabilities.matmulPrecision ?? 'exact', weightDtype: 'bf16' };
}

/** Deterministic pseudo-random token ids for a synthetic prompt. */
export function syntheticPrompt(len: number, vocab: number, seed = 1): number[] {
  let x = seed >>> 0 || 1;
  const out: number[] = [];
  for (let i = 0; i < len; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out.push(x % vocab);
  }
  return out;
}

/** A host-to-device copy rate measured on the backend, and how. */
export interface H2dBandwidth {
  /** Bytes moved per second (each byte counted once: it crosses the link once). */
  bytesPerS: number;
  /** Size of one timed copy. */
  bytes: number;
  iters: number;
}

/**
 * Pinned host -> compute-tier copy bandwidth: `iters` copies of one buffer from a 'pinned' buffer
 * to a compute-tier buffer, timed with the backend's events (the path streamed weight blocks
 * take). The pinned arena may be mostly taken by the engine's host replicas, so sizes are tried
 * from `bytes` down by halves to 4 MiB. Returns null on a backend whose compute tier is host
 * memory (there is no host-to-device link) or when no buffer pair could be allocated.
 */
export function measureH2dBandwidth(backend: DeviceBackend, bytes = 256 * 2 ** 20, iters = 8): H2dBandwidth | null {
  const caps = backend.capabilities;
  if (caps.deviceKind === 'cpu' || caps.computeTier !== 'vram') return null;
  for (let size = bytes; size >= 4 * 2 ** 20; size /= 2) {
    const length = Math.floor(size / 4);
    let src: ReturnType<DeviceBackend['alloc']> | undefined;
    let dst: ReturnType<DeviceBackend['alloc']> | undefined;
    try {
      src = backend.alloc({ dtype: 'f32', length, tier: 'pinned', usage: 'workspace', label: 'bench.h2d.src' });
      dst = backend.alloc({ dtype: 'f32', length, tier: caps.computeTier, usage: 'workspace', label: 'bench.h2d.dst' });
    } catch {
      if (src) backend.free(src);
      continue;
    }
    const e0 = backend.createEvent();
    const e1 = backend.createEvent();
    // Smaller copies repeat more, so every measurement moves at least `iters` x `bytes`.
    const n = Math.max(iters, Math.ceil((iters * bytes) / (length * 4)));
    try {
      backend.copy(dst, src, length); // warm-up
      backend.synchronize('debug');
      backend.record(e0);
      for (let i = 0; i < n; i++) backend.copy(dst, src, length);
      backend.record(e1);
      backend.synchronize('debug');
      const ms = backend.elapsedMs(e0, e1);
      return { bytesPerS: (length * 4 * n) / (ms / 1000), bytes: length * 4, iters: n };
    } finally {
      backend.destroyEvent(e0);
      backend.destroyEvent(e1);
      backend.free(src);
      backend.free(dst);
    }
  }
  return null;
}

/**
 * Run `fn` on a short-lived backend of the given kind with room for the scratch buffers of the
 * measurements above (1 GiB of device memory, 512 MiB pinned; the GEMM shapes of GPU_GEMM_SHAPES
 * take about 350 MiB), then dispose of it. An engine under
 * a memory budget sizes its arenas to the budget and fills them by design, so rates are timed
 * here, before it is created. Undefined when that backend cannot be created (the engine will say why).
 */
export async function withScratchBackend<T>(
  choice: 'cpu' | 'cuda' | 'auto',
  fn: (b: DeviceBackend) => T,
  /** Options of the backend (numerics, matmul precision): a rate must be timed on the path the engine runs. */
  opts: Pick<BackendOptions, 'numerics' | 'matmulPrecision'> = {},
): Promise<T | undefined> {
  let backend: DeviceBackend;
  try {
    ({ backend } = await selectBackend(choice, { deviceArenaBytes: 2 ** 30, pinnedArenaBytes: 512 * 2 ** 20, ...opts }));
  } catch {
    return undefined;
  }
  try {
    return fn(backend);
  } finally {
    backend.dispose();
  }
}
