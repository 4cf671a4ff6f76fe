/**
 * Op mlp_slice on the CUDA backend: compute near data. The slice's weights live in pinned host
 * memory, so the host CPU computes it (native/host/host_mlp.cc, a thread pool with AVX2/AVX-512 bf16
 * kernels), stream-ordered: x is copied to host staging, a host function computes on the stream
 * (cudaLaunchHostFunc, so a captured graph replays it), and the result is copied back. The
 * native argument block for each distinct set of buffers is made once and kept, so replays and
 * later passes allocate nothing.
 */
import type { OpArgs } from '@nerva/core';
import { CudaArgumentError } from './errors.js';

/** The addon's host-MLP entry points (native/host/host_mlp.h, bound in native/addon/host_compute.cc). */
export interface HostMlpNative {
  hostMlpCreate(a: { rows: number; hidden: number; inter: number; eps: number; x: number; normW: number; gateUp: number; down: number; y: number }): number;
  hostMlpEnqueue(id: number, stream: number): void;
  hostMlpDestroy(id: number): void;
  hostMlpStats(): { calls: number; ns: number; threads: number; isa: string };
}

export interface ResolvedHostBuf {
  addr: number;
  dtype: string;
  length: number;
  tier: string;
  id: number;
}

/** Checks the op's buffers for the host path; returns the key of its native argument block. */
export function hostMlpKey(a: OpArgs<'mlp_slice'>, r: (name: string) => ResolvedHostBuf | undefined): string {
  const { rows, hidden: H, inter: c } = a;
  for (const [k, v] of Object.entries({ rows, hidden: H, inter: c })) {
    if (!Number.isInteger(v) || v < (k === 'inter' ? 0 : 1)) throw new CudaArgumentError('mlp_slice', `${k} must be a ${k === 'inter' ? 'non-negative' : 'positive'} integer, got ${v}`);
  }
  if (!(a.eps >= 0)) throw new CudaArgumentError('mlp_slice', `eps must be >= 0, got ${a.eps}`);
  const need = (name: string, dtype: string, length: number, tier?: 'pinned') => {
    const b = r(name);
    if (!b) throw new CudaArgumentError('mlp_slice', `${name} is required on CUDA (host staging for compute near data)`);
    if (b.dtype !== dtype) throw new CudaArgumentError('mlp_slice', `${name} must be ${dtype}, got ${b.dtype}`);
    if (b.length < length) throw new CudaArgumentError('mlp_slice', `${name} holds ${b.length} elements, needs ${length}`);
    if (tier && b.tier !== tier) throw new CudaArgumentError('mlp_slice', `${name} must be in the 'pinned' tier (the host computes near it), got '${b.tier}'`);
    return b;
  };
  const parts = [
    need('x', 'f32', rows * H),
    need('out', 'f32', rows * H),
    need('normWeight', 'f32', H, 'pinned'),
    need('gateUp', 'bf16', 2 * c * H, 'pinned'),
    need('down', 'bf16', H * c, 'pinned'),
    need('xHost', 'f32', rows * H, 'pinned'),
    need('yHost', 'f32', rows * H, 'pinned'),
  ];
  return `${parts.map((p) => `${p.id}@${p.addr}`).join(',')}|${rows},${H},${c},${a.eps}`;
}
