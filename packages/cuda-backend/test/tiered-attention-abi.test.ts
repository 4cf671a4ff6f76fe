import { describe, expect, it } from 'vitest';
import type { DeviceBuffer, DType, Tier } from '@nerva/core';
import { OpEncoder, type ResolvedBuffer } from '../src/abi/index.js';
import { hostAttentionPlan, type ResolvedAttnBuf } from '../src/host-attention.js';
import { CudaArgumentError } from '../src/index.js';

// Tiered KV on the CUDA backend, host half: the encoder packs the window and the partial
// attention's lse for the kernels, attention_merge for its kernel, and a KV cache in pinned
// memory is planned for the host path (native/host/host_attention.cc) with its staging checked.
const resolved = new Map<number, ResolvedBuffer & { tier: Tier }>();
function buf(dtype: DType, length: number, tier: Tier = 'vram'): DeviceBuffer {
  const id = resolved.size + 1;
  resolved.set(id, { addr: 0x100000 * id, dtype, length, tier });
  return { id, dtype, length, byteLength: length * 4, tier, usage: 'activations' };
}
const enc = new OpEncoder((b) => resolved.get(b.id)!);
const res = (bufs: Record<string, unknown>) => (name: string): ResolvedAttnBuf | undefined => {
  const b = bufs[name] as DeviceBuffer | undefined;
  if (!b) return undefined;
  const r = resolved.get(b.id)!;
  return { addr: r.addr, dtype: r.dtype, length: r.length, tier: r.tier, id: b.id };
};

function attentionArgs(tier: Tier, extra: Record<string, unknown> = {}) {
  const rows = 2, H = 4, KVH = 2, hd = 8, bs = 4, mbps = 3;
  return {
    q: buf('f32', rows * 3 * H * hd),
    kCache: buf('bf16', 10 * bs * KVH * hd, tier),
    vCache: buf('bf16', 10 * bs * KVH * hd, tier),
    out: buf('f32', rows * H * hd),
    blockTables: buf('i32', 2 * mbps),
    rowSeq: buf('i32', rows),
    positions: buf('i32', rows),
    rows, numHeads: H, numKvHeads: KVH, headDim: hd, blockSize: bs, maxBlocksPerSeq: mbps, qRowStride: 3 * H * hd, qOffset: 0, scale: 0.25,
    ...extra,
  };
}

describe('tiered attention on CUDA (host half)', () => {
  it('packs window, lse and oneSequence after the scale; no lse is a null buffer', () => {
    const lse = buf('f32', 8);
    const a = attentionArgs('vram', { window: 5, lse });
    enc.encode('attention', a);
    const tail = Array.from(enc.args.subarray(enc.n - 5, enc.n));
    expect(tail).toEqual([0.25, 5, resolved.get(lse.id)!.addr, 0, 0]);
    enc.encode('attention', attentionArgs('vram'));
    expect(Array.from(enc.args.subarray(enc.n - 5, enc.n))).toEqual([0.25, 0, 0, 0, 0]);
    enc.encode('attention', attentionArgs('vram', { oneSequence: true }));
    expect(Array.from(enc.args.subarray(enc.n - 5, enc.n))).toEqual([0.25, 0, 0, 0, 1]);
    expect(() => enc.encode('attention', attentionArgs('vram', { lse: buf('f32', 3) }))).toThrow(/lse needs 8 elements, has 3/);
    expect(() => enc.encode('attention', attentionArgs('vram', { window: -1 }))).toThrow(CudaArgumentError);
  });

  it('packs attention_merge and checks its sizes', () => {
    const out = buf('f32', 2 * 4 * 8), lse = buf('f32', 8), other = buf('f32', 2 * 4 * 8), ol = buf('f32', 8);
    enc.encode('attention_merge', { out, lse, other, otherLse: ol, rows: 2, numHeads: 4, headDim: 8 });
    expect(Array.from(enc.args.subarray(0, enc.n))).toEqual([
      resolved.get(out.id)!.addr, 0, resolved.get(lse.id)!.addr, 0, resolved.get(other.id)!.addr, 0, resolved.get(ol.id)!.addr, 0, 2, 4, 8,
    ]);
    expect(() => enc.encode('attention_merge', { out, lse, other, otherLse: buf('f32', 4), rows: 2, numHeads: 4, headDim: 8 })).toThrow(/otherLse needs 8/);
  });

  it('plans a pinned KV cache for the host: cache geometry, staging buffers, one key per buffer set', () => {
    const a = attentionArgs('pinned', { window: 6, lse: buf('f32', 8), qHost: buf('f32', 64, 'pinned'), outHost: buf('f32', 64, 'pinned'), lseHost: buf('f32', 8, 'pinned') });
    const p = hostAttentionPlan(a, res(a));
    expect(p.create).toMatchObject({ rows: 2, numHeads: 4, numKvHeads: 2, headDim: 8, blockSize: 4, maxBlocksPerSeq: 3, numSeqs: 2, numBlocks: 10, window: 6, kvDtype: 1, qStride: 96 });
    expect(p.create.lseHost).toBe(resolved.get((a as unknown as { lseHost: DeviceBuffer }).lseHost.id)!.addr);
    expect(hostAttentionPlan(a, res(a)).key).toBe(p.key);
    const b = { ...a, window: 7 };
    expect(hostAttentionPlan(b, res(b)).key).not.toBe(p.key);
  });

  it('refuses a host plan without pinned staging, with a cache outside pinned memory, or short buffers', () => {
    const base = attentionArgs('pinned', { qHost: buf('f32', 64, 'pinned'), outHost: buf('f32', 64, 'pinned') });
    expect(() => hostAttentionPlan({ ...base, qHost: undefined }, res({ ...base, qHost: undefined }))).toThrow(/qHost is required/);
    const inVram = { ...base, outHost: buf('f32', 64, 'vram') };
    expect(() => hostAttentionPlan(inVram, res(inVram))).toThrow(/outHost must be in the 'pinned' tier/);
    const withLse = { ...base, lse: buf('f32', 8) };
    expect(() => hostAttentionPlan(withLse, res(withLse))).toThrow(/lseHost is required/);
    const mixed = { ...base, vCache: buf('f32', 640, 'pinned') };
    expect(() => hostAttentionPlan(mixed, res(mixed))).toThrow(/vCache must be bf16/);
    const shortQ = { ...base, qHost: buf('f32', 10, 'pinned') };
    expect(() => hostAttentionPlan(shortQ, res(shortQ))).toThrow(/qHost holds 10 elements, needs 64/);
    const bad = { ...base, numKvHeads: 3 };
    expect(() => hostAttentionPlan(bad, res(bad))).toThrow(/not a multiple/);
  });
});
