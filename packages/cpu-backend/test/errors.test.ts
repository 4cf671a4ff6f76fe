import { BackendError, HotPathAllocationError, NervaError, UnsupportedOpError } from '@nerva/core';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  BackendDisposedError,
  BufferDTypeError,
  BufferRangeError,
  CaptureStateError,
  CpuBackend,
  EventStateError,
  InvalidBufferSpecError,
  OpArgumentError,
  OutOfMemoryError,
  UnknownHandleError,
  UnsupportedTierError,
} from '../src/index.js';
import { upload, zeros } from './helpers.js';

let be: CpuBackend;
beforeEach(() => {
  be = new CpuBackend();
});
afterEach(() => {
  be.dispose();
});

/** Run `f` and return what it threw (failing the test if it did not). */
function thrown(f: () => unknown): Error {
  try {
    f();
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected an error');
}

describe('buffers', () => {
  it('rejects tiers the backend does not have, with a typed error', () => {
    for (const tier of ['vram', 'disk', 'cxl'] as const) {
      const e = thrown(() => be.alloc({ dtype: 'f32', length: 4, tier }));
      expect(e).toBeInstanceOf(UnsupportedTierError);
      expect(e).toBeInstanceOf(BackendError);
      expect(e).toBeInstanceOf(NervaError);
      expect((e as UnsupportedTierError).code).toBe('UNSUPPORTED_TIER');
    }
    expect(be.alloc({ dtype: 'f32', length: 4, tier: 'dram' }).tier).toBe('dram');
    expect(be.alloc({ dtype: 'i32', length: 4 }).tier).toBe('dram');
    expect(be.stats().liveBuffers).toBe(2);
  });

  it("holds a 'pinned' host tier with a limit of its own, apart from the compute tier's", () => {
    const small = new CpuBackend({ memoryBytes: 64, hostMemoryBytes: 32 });
    expect(small.capabilities.memory).toEqual({ dram: 64, pinned: 32 });
    small.alloc({ dtype: 'f32', length: 16 }); // 64 bytes of dram: the compute tier is full
    const p = small.alloc({ dtype: 'f32', length: 8, tier: 'pinned' });
    expect(p.tier).toBe('pinned');
    expect(thrown(() => small.alloc({ dtype: 'f32', length: 1, tier: 'pinned' }))).toBeInstanceOf(OutOfMemoryError);
    expect(thrown(() => small.alloc({ dtype: 'f32', length: 1 }))).toBeInstanceOf(OutOfMemoryError);
    small.free(p);
    expect(small.alloc({ dtype: 'f32', length: 8, tier: 'pinned' }).tier).toBe('pinned');
    small.dispose();
  });

  it('rejects malformed specs and allocations over the memory budget', () => {
    expect(() => be.alloc({ dtype: 'f64' as never, length: 4 })).toThrow(InvalidBufferSpecError);
    expect(() => be.alloc({ dtype: 'f32', length: -1 })).toThrow(InvalidBufferSpecError);
    expect(() => be.alloc({ dtype: 'f32', length: 2.5 })).toThrow(InvalidBufferSpecError);
    const small = new CpuBackend({ memoryBytes: 1000 });
    small.alloc({ dtype: 'f32', length: 200 });
    expect(() => small.alloc({ dtype: 'f32', length: 51 })).toThrow(OutOfMemoryError);
    expect(small.stats().liveBytes).toBe(800);
  });

  it('catches double free, foreign handles and use after free', () => {
    const b = be.alloc({ dtype: 'f32', length: 8 });
    be.free(b);
    const e = thrown(() => be.free(b));
    expect(e).toBeInstanceOf(UnknownHandleError);
    expect(e.message).toMatch(/already freed/);
    expect(() => be.read(b)).toThrow(UnknownHandleError);
    const other = new CpuBackend();
    const foreign = other.alloc({ dtype: 'f32', length: 8 });
    expect(thrown(() => be.free(foreign)).message).toMatch(/not allocated by this backend/);
    // A forged handle with a live id is not the live buffer.
    const live = be.alloc({ dtype: 'f32', length: 8 });
    expect(() => be.free({ ...live })).toThrow(UnknownHandleError);
    expect(be.stats()).toMatchObject({ liveBuffers: 1, allocCalls: 2, freeCalls: 1 });
  });

  it('takes a quantized buffer only as whole raw blocks, and a refused write leaves it as it was', () => {
    const q = be.alloc({ dtype: 'q8_0', length: 64 });
    const block = new Uint8Array(34);
    block[0] = 0x00;
    block[1] = 0x3c; // f16 scale 1.0
    for (let i = 0; i < 32; i++) block[2 + i] = i;
    be.write(q, block, 32);
    const before = be.read(q);
    expect(Array.from(before.subarray(32))).toEqual(Array.from({ length: 32 }, (_, i) => i));
    expect(() => be.write(q, new Float32Array(32))).toThrow(BufferDTypeError);
    expect(() => be.write(q, new Uint8Array(33))).toThrow(BufferDTypeError);
    expect(() => be.write(q, block, 16)).toThrow(BufferDTypeError);
    expect(() => be.write(q, new Uint8Array(34 * 3))).toThrow(BufferRangeError);
    expect(be.read(q)).toEqual(before);
  });

  it('validates write, read and copy ranges and dtypes', () => {
    const f = be.alloc({ dtype: 'f32', length: 4 });
    const i = be.alloc({ dtype: 'i32', length: 4 });
    const h = be.alloc({ dtype: 'bf16', length: 4 });
    expect(() => be.write(f, new Float32Array(5))).toThrow(BufferRangeError);
    expect(() => be.write(f, new Float32Array(2), 3)).toThrow(BufferRangeError);
    expect(() => be.write(f, new Float32Array(1), -1)).toThrow(BufferRangeError);
    expect(() => be.write(f, new Int32Array(4))).toThrow(BufferDTypeError);
    expect(() => be.write(i, new Float32Array(4))).toThrow(BufferDTypeError);
    expect(() => be.write(h, new Int32Array(4))).toThrow(BufferDTypeError);
    expect(() => be.read(f, 2, 3)).toThrow(BufferRangeError);
    expect(() => be.read(f, 5)).toThrow(BufferRangeError);
    expect(() => be.peek(f, 1, 4)).toThrow(BufferRangeError);
    expect(() => be.copy(f, i, 4)).toThrow(BufferDTypeError);
    const g = be.alloc({ dtype: 'f32', length: 2 });
    expect(() => be.copy(g, f, 3)).toThrow(BufferRangeError);
    expect(() => be.copy(f, g, 2, 3)).toThrow(BufferRangeError);
    be.write(f, Float32Array.from([1, 2, 3, 4]));
    be.copy(f, f, 3, 1, 0); // overlapping, forward
    expect(Array.from(be.read(f))).toEqual([1, 1, 2, 3]);
    // Nothing out of range ever happened: every counter reflects only the successful calls.
    expect(be.stats().h2dBytes).toBe(16);
    expect(be.stats().d2dBytes).toBe(12);
  });
});

describe('op argument validation', () => {
  it('names the op and the argument of a buffer that is too small', () => {
    const x = zeros(be, 8);
    const w = zeros(be, 8 * 4 - 1);
    const out = zeros(be, 4);
    const e = thrown(() => be.run('matmul', { x, weight: w, out, rows: 1, inDim: 8, outDim: 4 }));
    expect(e).toBeInstanceOf(OpArgumentError);
    expect(e).toMatchObject({ op: 'matmul', arg: 'weight', code: 'OP_ARGUMENT' });
    expect(e.message).toMatch(/has 31 elements, the op needs 32/);
    // weightOffset counts toward the size.
    const w2 = zeros(be, 32);
    expect(thrown(() => be.run('matmul', { x, weight: w2, out, rows: 1, inDim: 8, outDim: 4, weightOffset: 1 }))).toMatchObject({ arg: 'weight' });
    expect(thrown(() => be.run('matmul', { x, weight: w2, out, rows: 2, inDim: 8, outDim: 4 }))).toMatchObject({ arg: 'x' });
    expect(thrown(() => be.run('matmul', { x, weight: w2, out: x, rows: 1, inDim: 8, outDim: 1 }))).toMatchObject({ arg: 'out' });
    expect(be.stats().launches).toBe(0);
  });

  it('rejects wrong dtypes, bad attributes and out-of-range indices read from buffers', () => {
    const table = zeros(be, 10 * 4);
    const out = zeros(be, 4);
    const fIds = zeros(be, 1);
    expect(thrown(() => be.run('embedding', { table, ids: fIds, out, rows: 1, hidden: 4 }))).toMatchObject({ op: 'embedding', arg: 'ids' });
    const ids = upload(be, Int32Array.from([10]));
    const e = thrown(() => be.run('embedding', { table, ids, out, rows: 1, hidden: 4 }));
    expect(e).toMatchObject({ arg: 'ids' });
    expect(e.message).toMatch(/ids\[0\] = 10 is outside the table/);
    expect(thrown(() => be.run('embedding', { table, ids, out, rows: 1, hidden: 0 }))).toMatchObject({ arg: 'hidden' });
    // out may be f32 or bf16 (capabilities.activationDtypes), not f16.
    expect(thrown(() => be.run('rmsnorm', { x: out, weight: out, out: zeros(be, 4, 'f16'), rows: 1, dim: 4, eps: 1e-6 }))).toMatchObject({ arg: 'out' });
    expect(thrown(() => be.run('silu_mul', { x: zeros(be, 8), out: zeros(be, 4, 'f16'), rows: 1, dim: 4 }))).toMatchObject({ arg: 'out' });
    expect(thrown(() => be.run('rmsnorm', { x: out, weight: out, out, rows: 1, dim: 4, eps: NaN }))).toMatchObject({ arg: 'eps' });
    expect(thrown(() => be.run('rope', { x: zeros(be, 8), positions: zeros(be, 1, 'i32'), invFreq: zeros(be, 2), rows: 1, numHeads: 1, headDim: 3, rowStride: 8, headOffset: 0 }))).toMatchObject({
      arg: 'headDim',
    });
    expect(thrown(() => be.run('ring_push', { src: zeros(be, 5, 'i32'), ring: zeros(be, 4, 'i32'), cursor: zeros(be, 1, 'i32'), rows: 5, capacity: 4 }))).toMatchObject({ arg: 'rows' });
    expect(thrown(() => be.run('moe_route', { logits: zeros(be, 4), topIds: zeros(be, 5, 'i32'), topWeights: zeros(be, 5), rows: 1, numExperts: 4, topK: 5, normalize: true }))).toMatchObject({
      arg: 'topK',
    });
    expect(() => be.run('no_such_op' as never, {} as never)).toThrow(UnsupportedOpError);
  });

  it('checks slots, block tables, sequences and positions of the paged ops', () => {
    const src = zeros(be, 4);
    const kc = zeros(be, 3 * 2);
    const vc = zeros(be, 3 * 2);
    const kv = (slot: number) => be.run('kv_append', { src, kCache: kc, vCache: vc, slots: upload(be, Int32Array.from([slot])), rows: 1, numKvHeads: 1, headDim: 2, rowStride: 4, kOffset: 0, vOffset: 2 });
    expect(thrown(() => kv(3))).toMatchObject({ op: 'kv_append', arg: 'slots' });
    kv(-1); // padding is fine
    kv(2);
    const attn = (table: number[], pos: number, seq = 0) =>
      be.run('attention', {
        q: zeros(be, 2),
        kCache: kc,
        vCache: vc,
        out: zeros(be, 2),
        blockTables: upload(be, Int32Array.from(table)),
        rowSeq: upload(be, Int32Array.from([seq])),
        positions: upload(be, Int32Array.from([pos])),
        rows: 1,
        numHeads: 1,
        numKvHeads: 1,
        headDim: 2,
        blockSize: 1,
        maxBlocksPerSeq: 2,
        qRowStride: 2,
        qOffset: 0,
        scale: 1,
      });
    expect(thrown(() => attn([0, 3], 1))).toMatchObject({ arg: 'blockTables' });
    expect(thrown(() => attn([0, 1], 2))).toMatchObject({ arg: 'positions' });
    expect(thrown(() => attn([0, 1], 0, 1))).toMatchObject({ arg: 'rowSeq' });
    attn([0, -1], 0); // an unused entry past the position is never read
    const adv = (table: number[]) =>
      be.run('advance_positions', {
        positions: upload(be, Int32Array.from([1])),
        slots: zeros(be, 1, 'i32'),
        blockTables: upload(be, Int32Array.from(table)),
        rowSeq: upload(be, Int32Array.from([0])),
        rows: 1,
        blockSize: 2,
        maxBlocksPerSeq: 2,
      });
    expect(thrown(() => adv([0, -1]))).toMatchObject({ op: 'advance_positions', arg: 'blockTables' });
    adv([0, 1]);
  });
});

describe('hot-path guard', () => {
  it('rejects and counts every allocation while armed, and only then', () => {
    be.alloc({ dtype: 'f32', length: 4 });
    be.setHotPath(true);
    expect(() => be.alloc({ dtype: 'f32', length: 4, label: 'x' })).toThrow(HotPathAllocationError);
    expect(() => be.alloc({ dtype: 'i32', length: 1 })).toThrow(HotPathAllocationError);
    expect(be.stats()).toMatchObject({ hotPathAllocations: 2, allocCalls: 1, liveBuffers: 1 });
    be.setHotPath(false);
    be.alloc({ dtype: 'f32', length: 4 });
    expect(be.stats()).toMatchObject({ hotPathAllocations: 2, allocCalls: 2, liveBuffers: 2 });
  });

  it('decode-style ops run while armed (they allocate no buffers)', () => {
    const logits = upload(be, Float32Array.from([0, 1, 2, 3]));
    const params = upload(be, Float32Array.from([1, 2, 1, 0]));
    const rngBuf = upload(be, Int32Array.from([1, 0]));
    const out = zeros(be, 1, 'i32');
    be.setHotPath(true);
    be.run('sample', { logits, params, rng: rngBuf, out, rows: 1, vocab: 4 });
    be.run('argmax', { logits, out, rows: 1, vocab: 4 });
    expect(be.stats().hotPathAllocations).toBe(0);
  });
});

describe('streams, events, syncs, lifetime', () => {
  it('times events, counts syncs by kind and rejects unknown handles', () => {
    const s = be.createStream();
    const a = be.createEvent();
    const b = be.createEvent();
    expect(() => be.elapsedMs(a, b)).toThrow(EventStateError);
    be.record(a, s);
    be.record(b);
    expect(be.elapsedMs(a, b)).toBeGreaterThanOrEqual(0);
    be.waitEvent(s, a);
    be.synchronize('policy');
    be.synchronize('hard', s);
    be.read(zeros(be, 1)); // a read is a hard sync too
    expect(be.stats().syncs).toEqual({ hard: 2, soft_visibility: 1, debug: 0, policy: 1, phase_handoff: 0 });
    be.destroyStream(s);
    expect(() => be.synchronize('hard', s)).toThrow(UnknownHandleError);
    be.destroyEvent(a);
    expect(() => be.record(a)).toThrow(UnknownHandleError);
    expect(() => be.synchronize('bogus' as never)).toThrow(BackendError);
  });

  it('synchronizeEvent: a recorded event is counted under its kind; bad events and kinds are clear errors', () => {
    const e = be.createEvent();
    expect(() => be.synchronizeEvent(e, 'policy')).toThrow(EventStateError);
    be.record(e);
    expect(() => be.synchronizeEvent(e, 'bogus' as never)).toThrow(BackendError);
    expect(be.stats().syncs.policy).toBe(0);
    be.synchronizeEvent(e, 'policy');
    expect(be.stats().syncs.policy).toBe(1);
    be.destroyEvent(e);
    expect(() => be.synchronizeEvent(e, 'policy')).toThrow(UnknownHandleError);
  });

  it('peek reads without counting a sync', () => {
    const b = upload(be, Int32Array.from([4, 5, 6]));
    expect(Array.from(be.peek(b, 1, 2))).toEqual([5, 6]);
    expect(be.stats().syncs.hard).toBe(0);
    expect(be.stats().d2hBytes).toBe(8);
  });

  it('dispose frees every buffer and refuses later calls', () => {
    zeros(be, 10);
    zeros(be, 10, 'i32');
    be.dispose();
    expect(be.stats()).toMatchObject({ liveBuffers: 0, liveBytes: 0, freeCalls: 2 });
    expect(() => be.alloc({ dtype: 'f32', length: 1 })).toThrow(BackendDisposedError);
    be.dispose(); // idempotent
  });

  it('capture misuse is a typed error', () => {
    expect(() => be.endCapture()).toThrow(CaptureStateError);
    be.beginCapture();
    expect(() => be.beginCapture()).toThrow(CaptureStateError);
    expect(() => be.synchronize('hard')).toThrow(CaptureStateError);
    expect(() => be.read(zeros(be, 1))).toThrow(CaptureStateError);
    const s = be.createStream();
    expect(() => be.endCapture(s)).toThrow(CaptureStateError);
    const g = be.endCapture();
    be.destroyGraph(g);
    expect(() => be.replay(g)).toThrow(UnknownHandleError);
  });
  it('fused ops reject bad arguments with OpArgumentError and leave their buffers untouched', () => {
    const x = upload(be, new Float32Array(8).fill(1)), w = zeros(be, 2 * 4 * 8), out = zeros(be, 4), bias = zeros(be, 4);
    expect(thrown(() => be.run('fused_matmul', { x, weight: w, out, bias, rows: 1, inDim: 8, outDim: 4, glu: true }))).toBeInstanceOf(OpArgumentError);
    const qkv = upload(be, new Float32Array(2 * 16).fill(0.5)), pos = upload(be, new Int32Array([3, 4])), inv = upload(be, new Float32Array([1, 0.1]));
    const kc = zeros(be, 4 * 4), vc = zeros(be, 4 * 4), badSlots = upload(be, new Int32Array([0, 99]));
    const args = { qkv, positions: pos, invFreq: inv, slots: badSlots, kCache: kc, vCache: vc, rows: 2, numHeads: 2, numKvHeads: 1, headDim: 4 };
    expect(thrown(() => be.run('rope_append', { ...args, rowStride: 15 }))).toBeInstanceOf(OpArgumentError);
    expect(Array.from(be.read(qkv))).toEqual(new Array(32).fill(0.5));
  });
});
