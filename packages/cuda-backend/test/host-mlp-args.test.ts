import type { DeviceBuffer, OpArgs } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { CudaArgumentError } from '../src/errors.js';
import { hostMlpKey, type ResolvedHostBuf } from '../src/host-mlp.js';

// Buffers as the backend would resolve them; the handles themselves are only names here.
const H = 64;
const c = 16;
const rows = 2;
const bufs: Record<string, ResolvedHostBuf> = {
  x: { addr: 0x1000, dtype: 'f32', length: rows * H, tier: 'vram', id: 1 },
  out: { addr: 0x2000, dtype: 'f32', length: rows * H, tier: 'vram', id: 2 },
  normWeight: { addr: 0x3000, dtype: 'f32', length: H, tier: 'pinned', id: 3 },
  gateUp: { addr: 0x4000, dtype: 'bf16', length: 2 * c * H, tier: 'pinned', id: 4 },
  down: { addr: 0x5000, dtype: 'bf16', length: H * c, tier: 'pinned', id: 5 },
  xHost: { addr: 0x6000, dtype: 'f32', length: rows * H, tier: 'pinned', id: 6 },
  yHost: { addr: 0x7000, dtype: 'f32', length: rows * H, tier: 'pinned', id: 7 },
};
const handle = (id: number) => ({ id }) as DeviceBuffer;
const args = (over: Partial<OpArgs<'mlp_slice'>> = {}): OpArgs<'mlp_slice'> => ({
  x: handle(1),
  out: handle(2),
  normWeight: handle(3),
  gateUp: handle(4),
  down: handle(5),
  xHost: handle(6),
  yHost: handle(7),
  rows,
  hidden: H,
  inter: c,
  eps: 1e-6,
  ...over,
});

function thrown(f: () => unknown): Error {
  try {
    f();
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected an error');
}

describe('mlp_slice on CUDA: argument checks (no GPU needed)', () => {
  it('keys one native argument block per set of buffers and shape', () => {
    const k1 = hostMlpKey(args(), (n) => bufs[n]);
    expect(hostMlpKey(args(), (n) => bufs[n])).toBe(k1);
    expect(hostMlpKey(args({ rows: 1 }), (n) => bufs[n])).not.toBe(k1);
  });

  it('rejects weights outside the pinned tier, wrong dtypes, short buffers, missing staging', () => {
    const cases: Array<[string, (n: string) => ResolvedHostBuf | undefined, RegExp]> = [
      ['gateUp in vram', (n) => (n === 'gateUp' ? { ...bufs.gateUp, tier: 'vram' } : bufs[n]), /gateUp must be in the 'pinned' tier/],
      ['down as f32', (n) => (n === 'down' ? { ...bufs.down, dtype: 'f32' } : bufs[n]), /down must be bf16/],
      ['short yHost', (n) => (n === 'yHost' ? { ...bufs.yHost, length: 3 } : bufs[n]), /yHost holds 3 elements/],
      ['no xHost', (n) => (n === 'xHost' ? undefined : bufs[n]), /xHost is required on CUDA/],
    ];
    for (const [, resolve, msg] of cases) {
      const e = thrown(() => hostMlpKey(args(), resolve));
      expect(e).toBeInstanceOf(CudaArgumentError);
      expect(e.message).toMatch(msg);
    }
    expect(thrown(() => hostMlpKey(args({ rows: 0 }), (n) => bufs[n])).message).toMatch(/rows must be a positive integer/);
    expect(thrown(() => hostMlpKey(args({ eps: -1 }), (n) => bufs[n])).message).toMatch(/eps must be >= 0/);
  });
});
