/**
 * Op attention on the CUDA backend when the KV cache lives in pinned host memory (tiered KV's
 * warm pages): compute near data. The host CPU computes the attention where the pages lie
 * (native/host/host_attention.cc, a thread pool with AVX2/AVX-512 inner loops), stream-ordered: q and
 * the int buffers go to host staging, the host computes, and out (and lse) come back, all
 * enqueued by the addon as one round trip that a captured graph replays, through a host channel
 * (native/host/host_channel.h: kernels write and poll words in mapped memory that a spinning host
 * thread serves, ~30 us a round trip). Only q and the result cross PCIe, never the pages. The
 * native argument block for each distinct set of buffers is made once and kept, so replays and
 * later passes allocate nothing.
 */
import type { OpArgs } from '@nerva/core';
import { CudaArgumentError } from './errors.js';

/** The addon's host-attention entry points (native/host/host_attention.h, bound in native/addon/host_compute.cc). */
export interface HostAttnNative {
  hostAttnCreate(a: HostAttnCreateArgs): number;
  hostAttnEnqueue(id: number, stream: number): void;
  hostAttnDestroy(id: number): void;
  hostAttnStats(): {
    calls: number;
    ns: number;
    keys: number;
    badBlocks: number;
    threads: number;
    /** Round trips through host channels (absent from an addon without them). */
    channel?: boolean;
    channelServed?: number;
    /** Channel waits that gave up (their outputs are NaN): a stuck host. */
    channelTimeouts?: number;
    /** Idle polls of the channel server in naps (nothing came for 3 ms). */
    channelNaps?: number;
  };
}

export interface HostAttnCreateArgs {
  rows: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  blockSize: number;
  maxBlocksPerSeq: number;
  numSeqs: number;
  numBlocks: number;
  window: number;
  scale: number;
  kvDtype: number;
  k: number;
  v: number;
  qHost: number;
  outHost: number;
  lseHost: number;
  q: number;
  qStride: number;
  qOffset: number;
  tables: number;
  rowSeq: number;
  positions: number;
  /** Where out (and lse) land on the device. */
  out: number;
  lse: number;
}

export interface ResolvedAttnBuf {
  addr: number;
  dtype: string;
  length: number;
  tier: string;
  id: number;
}

const KV_DTYPES: Record<string, number> = { f32: 0, bf16: 1, f16: 2 };

/**
 * Checks the op's buffers for the host path; returns the key of its native argument block and
 * the arguments to create it with.
 */
export function hostAttentionPlan(a: OpArgs<'attention'>, r: (name: string) => ResolvedAttnBuf | undefined): { key: string; create: HostAttnCreateArgs } {
  const fail = (detail: string): never => {
    throw new CudaArgumentError('op attention (host, pinned KV)', detail);
  };
  const ints = { rows: a.rows, numHeads: a.numHeads, numKvHeads: a.numKvHeads, headDim: a.headDim, blockSize: a.blockSize, maxBlocksPerSeq: a.maxBlocksPerSeq, qRowStride: a.qRowStride, qOffset: a.qOffset, window: a.window ?? 0 };
  for (const [k, v] of Object.entries(ints)) {
    const min = k === 'rows' || k === 'qOffset' || k === 'window' ? 0 : 1;
    if (!Number.isInteger(v) || v < min) fail(`${k} must be an integer >= ${min}, got ${v}`);
  }
  const { rows, numHeads: H, numKvHeads: KVH, headDim: hd, blockSize: bs, maxBlocksPerSeq: mbps } = a;
  if (H % KVH !== 0) fail(`numHeads ${H} is not a multiple of numKvHeads ${KVH}`);
  if (hd > 256) fail(`headDim ${hd} > 256 is not supported`);
  if (a.qOffset + H * hd > a.qRowStride) fail(`q heads exceed qRowStride ${a.qRowStride}`);
  if (!Number.isFinite(a.scale)) fail(`scale must be finite, got ${a.scale}`);
  const need = (name: string, dtypes: string[], length: number, tier?: 'pinned') => {
    const b = r(name);
    if (!b) return fail(`${name} is required (host staging for a KV cache in pinned memory)`);
    if (!dtypes.includes(b.dtype)) fail(`${name} must be ${dtypes.join(' or ')}, got ${b.dtype}`);
    if (b.length < length) fail(`${name} holds ${b.length} elements, needs ${length}`);
    if (tier && b.tier !== tier) fail(`${name} must be in the 'pinned' tier (the host computes on it), got '${b.tier}'`);
    return b;
  };
  const w = KVH * hd;
  const k = need('kCache', ['f32', 'bf16', 'f16'], w, 'pinned');
  const v = need('vCache', [k.dtype], w, 'pinned');
  const numBlocks = Math.floor(Math.min(k.length, v.length) / w / bs);
  const tables = need('blockTables', ['i32'], mbps);
  const numSeqs = Math.floor(tables.length / mbps);
  const parts = [
    k,
    v,
    need('q', ['f32'], rows > 0 ? (rows - 1) * a.qRowStride + a.qOffset + H * hd : 0),
    need('out', ['f32'], rows * H * hd),
    tables,
    need('rowSeq', ['i32'], rows),
    need('positions', ['i32'], rows),
    need('qHost', ['f32'], rows * H * hd, 'pinned'),
    need('outHost', ['f32'], rows * H * hd, 'pinned'),
  ];
  let lseHost = 0;
  if (a.lse) {
    parts.push(need('lse', ['f32'], rows * H));
    const lh = need('lseHost', ['f32'], rows * H, 'pinned');
    parts.push(lh);
    lseHost = lh.addr;
  }
  const at = (name: string) => r(name)!.addr;
  const create: HostAttnCreateArgs = {
    rows, numHeads: H, numKvHeads: KVH, headDim: hd, blockSize: bs, maxBlocksPerSeq: mbps, numSeqs, numBlocks,
    window: a.window ?? 0, scale: a.scale, kvDtype: KV_DTYPES[k.dtype]!,
    k: k.addr, v: v.addr, qHost: at('qHost'), outHost: at('outHost'), lseHost,
    q: at('q'), qStride: a.qRowStride, qOffset: a.qOffset, tables: tables.addr, rowSeq: at('rowSeq'), positions: at('positions'),
    out: at('out'), lse: a.lse ? at('lse') : 0,
  };
  const key = `${parts.map((p) => `${p.id}@${p.addr}:${p.length}`).join(',')}|${rows},${H},${KVH},${hd},${bs},${mbps},${a.qRowStride},${a.qOffset},${create.window},${a.scale}`;
  return { key, create };
}
