import { describe, expect, it } from 'vitest';
import { OP_NAMES, type DeviceBuffer, type DType } from '@nerva/core';
import { DTYPE_CODES, OpEncoder, OP_CODES, type ResolvedBuffer } from '../src/abi/index.js';
import { CudaArgumentError } from '../src/index.js';

// The encoder is the host half of the native ABI: it runs without a GPU, so its packing and
// validation are tested here against fake buffers.
function fakeBuf(id: number, dtype: DType, length: number): DeviceBuffer {
  return { id, dtype, length, byteLength: length * 4, tier: 'vram', usage: 'activations' };
}
const resolved = new Map<number, ResolvedBuffer>();
function buf(dtype: DType, length: number): DeviceBuffer {
  const id = resolved.size + 1;
  resolved.set(id, { addr: 0x10000 * id, dtype, length });
  return fakeBuf(id, dtype, length);
}
const enc = new OpEncoder((b) => resolved.get(b.id)!);

describe('OpEncoder', () => {
  it('numbers ops in OP_NAMES order (the order of native/nerva.h)', () => {
    OP_NAMES.forEach((n, i) => expect(OP_CODES[n]).toBe(i));
    expect(DTYPE_CODES).toEqual({ f32: 0, bf16: 1, f16: 2, i32: 3, q8_0: 4, q4_0: 5, q4_k: 6, q6_k: 7 });
  });

  it('packs buffers as (address, dtype) then attributes', () => {
    const x = buf('f32', 2 * 64), w = buf('bf16', 100 + 32 * 64), out = buf('f32', 2 * 32);
    enc.encode('matmul', { x, weight: w, out, rows: 2, inDim: 64, outDim: 32, weightOffset: 100 });
    const a = Array.from(enc.args.subarray(0, enc.n));
    expect(a).toEqual([
      resolved.get(x.id)!.addr, 0,
      resolved.get(w.id)!.addr, 1,
      resolved.get(out.id)!.addr, 0,
      0, 0, // no bias
      2, 64, 32, 100,
      0, 0, 0, // no weightTail, tailFrom 0
      0, // accumulate off
    ]);
    enc.encode('matmul', { x, weight: w, out, rows: 2, inDim: 64, outDim: 32, weightOffset: 100, accumulate: true });
    expect(enc.args[enc.n - 1]).toBe(1);
  });

  it('packs a weightTail (q and k in one block type, v in another) after the attributes, and checks it', () => {
    const x = buf('f32', 256), head = buf('q4_k', 24 * 256), tail = buf('q6_k', 8 * 256), out = buf('f32', 32);
    enc.encode('fused_matmul', { x, weight: head, weightTail: tail, tailFrom: 24, out, rows: 1, inDim: 256, outDim: 32 });
    const a = Array.from(enc.args.subarray(0, enc.n));
    expect(a[3]).toBe(6); // the head's dtype code: q4_k
    expect(a.slice(enc.n - 3)).toEqual([resolved.get(tail.id)!.addr, 7, 24]);
    enc.encode('matmul', { x, weight: head, weightTail: tail, tailFrom: 24, out, rows: 1, inDim: 256, outDim: 32 });
    expect(Array.from(enc.args.subarray(enc.n - 4, enc.n))).toEqual([resolved.get(tail.id)!.addr, 7, 24, 0]);
    const base = { x, weight: head, out, rows: 1, inDim: 256, outDim: 32 };
    expect(() => enc.encode('fused_matmul', { ...base, weightTail: buf('q6_k', 7 * 256), tailFrom: 24 })).toThrow(/weightTail needs 2048 elements/);
    expect(() => enc.encode('fused_matmul', { ...base, weightTail: tail, tailFrom: 33 })).toThrow(/tailFrom must be <= outDim/);
    expect(() => enc.encode('fused_matmul', { ...base, tailFrom: 24 })).toThrow(/tailFrom needs weightTail/);
    expect(() => enc.encode('fused_matmul', { ...base, weightTail: buf('bf16', 8 * 256), tailFrom: 24 })).toThrow(/weightTail must be q8_0/);
    expect(() => enc.encode('fused_matmul', { ...base, outDim: 16, glu: true, weightTail: tail, tailFrom: 8 })).toThrow(/not allowed with glu/);
    expect(() => enc.encode('matmul', { ...base, weightOffset: 256, weightTail: tail, tailFrom: 24 })).toThrow(/not allowed with weightOffset/);
  });

  it('takes bf16 activations (capabilities.bf16Activations): rmsnorm and silu_mul outs, a matmul x over more than 8 rows', () => {
    const x16 = buf('bf16', 9 * 64), w = buf('bf16', 32 * 64), out = buf('f32', 9 * 32);
    enc.encode('matmul', { x: x16, weight: w, out, rows: 9, inDim: 64, outDim: 32 });
    expect(enc.args[1]).toBe(1); // x's dtype code: bf16
    expect(() => enc.encode('matmul', { x: buf('bf16', 8 * 64), weight: w, out, rows: 8, inDim: 64, outDim: 32 })).toThrow(/a bf16 x needs more than 8 rows/);
    const h = buf('f32', 4 * 16), nw = buf('bf16', 16);
    enc.encode('rmsnorm', { x: h, weight: nw, out: buf('bf16', 4 * 16), rows: 4, dim: 16, eps: 1e-6 });
    expect(() => enc.encode('rmsnorm', { x: h, weight: nw, out: buf('f16', 4 * 16), rows: 4, dim: 16, eps: 1e-6 })).toThrow(CudaArgumentError);
    enc.encode('silu_mul', { x: buf('f32', 2 * 2 * 8), out: buf('bf16', 2 * 8), rows: 2, dim: 8 });
    expect(enc.args[3]).toBe(1);
  });

  it('packs fused_matmul (norm weight, eps, glu, accumulate) and sizes a glu weight as 2*outDim rows', () => {
    const x = buf('f32', 64), w = buf('bf16', 2 * 16 * 64), out = buf('f32', 16), nw = buf('bf16', 64);
    enc.encode('fused_matmul', { x, weight: w, out, rows: 1, inDim: 64, outDim: 16, normWeight: nw, eps: 1e-5, glu: true });
    const a = Array.from(enc.args.subarray(0, enc.n));
    expect(a.slice(6)).toEqual([0, 0, resolved.get(nw.id)!.addr, 1, 1, 64, 16, 1e-5, 1, 0, 0, 0, 0]);
    const short = buf('bf16', 16 * 64);
    expect(() => enc.encode('fused_matmul', { x, weight: short, out, rows: 1, inDim: 64, outDim: 16, glu: true })).toThrow(/weight needs 2048 elements/);
    const bias = buf('f32', 16);
    expect(() => enc.encode('fused_matmul', { x, weight: w, out, bias, rows: 1, inDim: 64, outDim: 16, glu: true })).toThrow(CudaArgumentError);
  });

  it('packs rope_append and rejects a row stride too small for q, k and v', () => {
    const qkv = buf('f32', 2 * 64), pos = buf('i32', 2), inv = buf('f32', 4), slots = buf('i32', 2);
    const kc = buf('f32', 16 * 8), vc = buf('f32', 16 * 8);
    enc.encode('rope_append', { qkv, positions: pos, invFreq: inv, slots, kCache: kc, vCache: vc, rows: 2, numHeads: 4, numKvHeads: 2, headDim: 8, rowStride: 64 });
    const a = Array.from(enc.args.subarray(0, enc.n));
    expect(a.slice(12)).toEqual([0, 0, 0, 0, 2, 4, 2, 8, 64, 1e-6]);
    expect(() =>
      enc.encode('rope_append', { qkv, positions: pos, invFreq: inv, slots, kCache: kc, vCache: vc, rows: 2, numHeads: 4, numKvHeads: 2, headDim: 8, rowStride: 63 }),
    ).toThrow(/rowStride is 63/);
  });

  it('rejects short buffers, wrong dtypes and bad attributes with CudaArgumentError', () => {
    const x = buf('f32', 10), w = buf('bf16', 10), ids = buf('f32', 2), out = buf('f32', 10);
    expect(() => enc.encode('matmul', { x, weight: w, out, rows: 1, inDim: 4, outDim: 4 })).toThrow(/weight needs 16 elements, has 10/);
    expect(() => enc.encode('embedding', { table: w, ids, out, rows: 2, hidden: 5 })).toThrow(/ids must be i32, got f32/);
    expect(() => enc.encode('add', { a: x, b: x, out, length: -1 })).toThrow(CudaArgumentError);
    const q = buf('f32', 64), kc = buf('f32', 64), i = buf('i32', 4);
    expect(() =>
      enc.encode('attention', { q, kCache: kc, vCache: kc, out: q, blockTables: i, rowSeq: i, positions: i, rows: 1, numHeads: 3, numKvHeads: 2, headDim: 8, blockSize: 4, maxBlocksPerSeq: 1, qRowStride: 24, qOffset: 0, scale: 1 }),
    ).toThrow(/numHeads 3 is not a multiple of numKvHeads 2/);
  });

  it('checks strided rope reads against the buffer', () => {
    const x = buf('f32', 2 * 40), pos = buf('i32', 2), inv = buf('f32', 4);
    expect(() => enc.encode('rope', { x, positions: pos, invFreq: inv, rows: 2, numHeads: 2, headDim: 8, rowStride: 40, headOffset: 30 })).toThrow(/exceed rowStride 40/);
    enc.encode('rope', { x, positions: pos, invFreq: inv, rows: 2, numHeads: 2, headDim: 8, rowStride: 40, headOffset: 24 });
    expect(enc.args[enc.n - 1]).toBe(1e-6); // the default QK-norm epsilon
  });

  it('packs decoder_layers: the shared buffers, the attributes, then 13 buffers per layer (growing the argument array)', () => {
    const rows = 1, hidden = 16, nq = 4, nkv = 2, hd = 8, inter = 24, qkvOut = (nq + 2 * nkv) * hd;
    const shared = {
      x: buf('f32', rows * hidden), qkv: buf('f32', rows * qkvOut), attn: buf('f32', rows * nq * hd), mlp: buf('f32', rows * inter),
      positions: buf('i32', 1), slots: buf('i32', 1), blockTables: buf('i32', 4), rowSeq: buf('i32', 1), invFreq: buf('f32', hd / 2),
    };
    const layer = () => ({
      attnNorm: buf('bf16', hidden), qkv: buf('bf16', qkvOut * hidden), o: buf('bf16', hidden * nq * hd), mlpNorm: buf('bf16', hidden),
      gateUp: buf('bf16', 2 * inter * hidden), down: buf('bf16', hidden * inter), kCache: buf('f32', 64 * nkv * hd), vCache: buf('f32', 64 * nkv * hd),
    });
    const layers = Array.from({ length: 5 }, layer);
    const attrs = { rows, hidden, numHeads: nq, numKvHeads: nkv, headDim: hd, intermediate: inter, blockSize: 16, maxBlocksPerSeq: 4, eps: 1e-6, scale: 0.25 };
    enc.encode('decoder_layers', { ...shared, layers, ...attrs });
    // ... then the embed flag (absent: 0).
    expect(enc.n).toBe(9 * 2 + 13 + 5 * 26 + 1);
    const a = Array.from(enc.args.subarray(0, enc.n));
    expect(a[enc.n - 1]).toBe(0);
    // maxKeys and minKeys (absent: 0) between scale and the layer count.
    expect(a.slice(18, 31)).toEqual([1, 16, 4, 2, 8, 24, 16, 4, 1e-6, 0.25, 0, 0, 5]);
    // Layer 4: qkv weight after attnNorm; absent qkvBias, qNorm, kNorm encode as (0, 0).
    const l4 = a.slice(31 + 4 * 26, 31 + 5 * 26);
    // (qkvTail absent: (0, 0) right after qkv.)
    expect(l4.slice(0, 12)).toEqual([resolved.get(layers[4].attnNorm.id)!.addr, 1, resolved.get(layers[4].qkv.id)!.addr, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    expect(l4.slice(22)).toEqual([resolved.get(layers[4].kCache.id)!.addr, 0, resolved.get(layers[4].vCache.id)!.addr, 0]);
    const bad = [...layers.slice(0, 2), { ...layer(), down: buf('bf16', hidden * inter - 1) }];
    expect(() => enc.encode('decoder_layers', { ...shared, layers: bad, ...attrs })).toThrow(/layers\[2\]\.down needs 384 elements/);
    expect(() => enc.encode('decoder_layers', { ...shared, layers, ...attrs, numKvHeads: 3 })).toThrow(/not a multiple of numKvHeads 3/);
    enc.encode('decoder_layers', { ...shared, layers, ...attrs, maxKeys: 1024 });
    expect(enc.args[28]).toBe(1024);
    expect(enc.args[29]).toBe(0);
    expect(() => enc.encode('decoder_layers', { ...shared, layers, ...attrs, maxKeys: -1 })).toThrow(/maxKeys must be an integer >= 0, got -1/);
    expect(() => enc.encode('decoder_layers', { ...shared, layers, ...attrs, maxKeys: 2.5 })).toThrow(/maxKeys must be an integer >= 0, got 2.5/);
    enc.encode('decoder_layers', { ...shared, layers, ...attrs, minKeys: 8192 });
    expect([enc.args[28], enc.args[29], enc.args[30]]).toEqual([0, 8192, 5]);
    expect(() => enc.encode('decoder_layers', { ...shared, layers, ...attrs, minKeys: -3 })).toThrow(/minKeys must be an integer >= 0, got -3/);
    expect(() => enc.encode('decoder_layers', { ...shared, layers, ...attrs, minKeys: Number.NaN })).toThrow(/minKeys must be an integer >= 0, got NaN/);
    // embed: 1, the table (a row at least), the ids (one a row).
    const table = buf('bf16', 10 * hidden), ids = buf('i32', rows);
    enc.encode('decoder_layers', { ...shared, layers, ...attrs, embed: { table, ids } });
    expect(enc.n).toBe(9 * 2 + 13 + 5 * 26 + 5);
    expect(Array.from(enc.args.subarray(enc.n - 5, enc.n))).toEqual([1, resolved.get(table.id)!.addr, 1, resolved.get(ids.id)!.addr, 3]);
    expect(() => enc.encode('decoder_layers', { ...shared, layers, ...attrs, embed: { table: buf('bf16', hidden - 1), ids } })).toThrow(/embed\.table needs 16 elements/);
    expect(() => enc.encode('decoder_layers', { ...shared, layers, ...attrs, embed: { table, ids: buf('f32', 1) } })).toThrow(/embed\.ids/);
  });

  it('packs sample: the sampling, then a push flag (ring, cursor, capacity), an advance flag (positions, slots, tables, rowSeq, sizes) and a mask flag (bits, index, words)', () => {
    const rows = 2, vocab = 10;
    const logits = buf('f32', rows * vocab), params = buf('f32', rows * 4), rng = buf('i32', rows * 2), out = buf('i32', rows);
    const base = { logits, params, rng, out, rows, vocab };
    enc.encode('sample', base);
    expect(enc.n).toBe(4 * 2 + 3 + 3);
    // rows, vocab (the row stride), limit (ids sampled are below it; default vocab), no push, no advance, no mask.
    expect(Array.from(enc.args.subarray(8, enc.n))).toEqual([rows, vocab, vocab, 0, 0, 0]);
    enc.encode('sample', { ...base, limit: 7 });
    expect(Array.from(enc.args.subarray(8, enc.n))).toEqual([rows, vocab, 7, 0, 0, 0]);
    expect(() => enc.encode('sample', { ...base, limit: 11 })).toThrow(/limit must be at most vocab \(10\), got 11/);
    expect(() => enc.encode('sample', { ...base, limit: 0 })).toThrow(/limit must be an integer >= 1/);
    const ring = buf('i32', 8), cursor = buf('i32', 1);
    const positions = buf('i32', rows), slots = buf('i32', rows), blockTables = buf('i32', 3 * 4), rowSeq = buf('i32', rows);
    const advance = { positions, slots, blockTables, rowSeq, blockSize: 16, maxBlocksPerSeq: 4 };
    enc.encode('sample', { ...base, push: { ring, cursor, capacity: 8 }, advance });
    const A = (b: DeviceBuffer) => resolved.get(b.id)!.addr;
    expect(Array.from(enc.args.subarray(11, enc.n))).toEqual([1, A(ring), 3, A(cursor), 3, 8, 1, A(positions), 3, A(slots), 3, A(blockTables), 3, A(rowSeq), 3, 16, 4, 0]);
    // Token masks (constrained decoding) after advance: flag, bits, index, words (ceil(limit / 32) at least),
    // masks (the whole masks bits holds, so the device never reads past it).
    const bits = buf('i32', 2), index = buf('i32', rows);
    enc.encode('sample', { ...base, mask: { bits, index, words: 1 } });
    expect(Array.from(enc.args.subarray(11, enc.n))).toEqual([0, 0, 1, A(bits), 3, A(index), 3, 1, 2]);
    const bits7 = buf('i32', 7);
    enc.encode('sample', { ...base, mask: { bits: bits7, index, words: 3 } });
    expect(Array.from(enc.args.subarray(11, enc.n))).toEqual([0, 0, 1, A(bits7), 3, A(index), 3, 3, 2]);
    expect(() => enc.encode('sample', { ...base, mask: { bits, index, words: 3 } })).toThrow(/mask\.bits needs 3 elements, has 2/);
    const wide = { ...base, logits: buf('f32', rows * 40), vocab: 40 };
    expect(() => enc.encode('sample', { ...wide, mask: { bits, index, words: 1 } })).toThrow(/mask\.words must cover the 40 sampled ids \(at least 2\), got 1/);
    expect(() => enc.encode('sample', { ...base, mask: { bits: buf('f32', 2), index, words: 1 } })).toThrow(/mask\.bits must be i32/);
    expect(() => enc.encode('sample', { ...base, mask: { bits, index: buf('i32', 1), words: 1 } })).toThrow(/mask\.index needs 2 elements/);
    expect(() => enc.encode('sample', { ...base, push: { ring, cursor, capacity: 1 } })).toThrow(/2 rows exceed the ring capacity 1/);
    expect(() => enc.encode('sample', { ...base, push: { ring: buf('i32', 4), cursor, capacity: 8 } })).toThrow(/push\.ring needs 8 elements, has 4/);
    expect(() => enc.encode('sample', { ...base, advance: { ...advance, slots: buf('f32', rows) } })).toThrow(/advance\.slots must be i32/);
    expect(() => enc.encode('sample', { ...base, advance: { ...advance, blockSize: 0 } })).toThrow(/advance\.blockSize must be an integer >= 1/);
    expect(() => enc.encode('sample', { ...base, push: 5 as unknown as { ring: DeviceBuffer; cursor: DeviceBuffer; capacity: number } })).toThrow(CudaArgumentError);
  });
});
