import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { dequantize, quantize } from '@nerva/core';
import { convertToGguf, GgufError, GgufFile, requantizeGguf, type GgufConvertType } from '../src/index.js';
import { MODELS, tempDir } from './helpers.js';

/** Every tensor's name, type, dims and bytes, and the metadata, of a GGUF file. */
async function contents(path: string) {
  const f = await GgufFile.open(path);
  try {
    const tensors = [];
    for (const t of f.tensors) tensors.push({ name: t.name, type: t.type, dims: t.dims, bytes: Buffer.from(await f.readTensor(t.name)) });
    return { tensors, metadata: new Map(f.metadata) };
  } finally {
    await f.close();
  }
}

const failure = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => e as GgufError);

describe('GGUF → GGUF at another type (as llama-quantize)', () => {
  // An F32 file holds the source's values exactly, so writing it again at a type must give the
  // file a direct conversion writes: the same tensors, types, bytes and metadata.
  it.each([
    ['tiny-shakespeare-qwen3', 'Q4_K_M'],
    ['tiny-shakespeare-qwen3', 'IQ4_XS'],
    ['tiny-random-qwen3-moe', 'Q5_K_M'],
    ['tiny-random-llama', 'Q8_0'],
  ] as const)('%s: F32 file → %s equals the direct conversion, byte for byte', async (name, type: GgufConvertType) => {
    const dir = await tempDir();
    const f32 = join(dir, 'f32.gguf');
    await convertToGguf({ source: join(MODELS, name), out: f32, type: 'F32' });
    const direct = join(dir, 'direct.gguf');
    await convertToGguf({ source: join(MODELS, name), out: direct, type });
    const again = join(dir, 'again.gguf');
    const r = await convertToGguf({ source: f32, out: again, type });
    expect(r.tensors.length).toBeGreaterThan(0);
    const [a, b] = await Promise.all([contents(direct), contents(again)]);
    expect(b.tensors.map((t) => [t.name, t.type, t.dims])).toEqual(a.tensors.map((t) => [t.name, t.type, t.dims]));
    for (let i = 0; i < a.tensors.length; i++) expect(b.tensors[i].bytes.equals(a.tensors[i].bytes), a.tensors[i].name).toBe(true);
    expect(b.metadata).toEqual(a.metadata);
  });

  it('a file already at the type is copied tensor for tensor without --allow-requantize', async () => {
    const dir = await tempDir();
    const src = join(dir, 'q.gguf');
    await convertToGguf({ source: join(MODELS, 'tiny-shakespeare-qwen3'), out: src, type: 'Q4_K_M' });
    const out = join(dir, 'same.gguf');
    await requantizeGguf({ source: src, out, type: 'Q4_K_M', name: 'renamed' });
    const [a, b] = await Promise.all([contents(src), contents(out)]);
    for (let i = 0; i < a.tensors.length; i++) expect(b.tensors[i].bytes.equals(a.tensors[i].bytes), a.tensors[i].name).toBe(true);
    expect(b.metadata.get('general.name')).toEqual({ type: 'STRING', value: 'renamed' });
  });

  it('block-quantized tensors are re-encoded only with allowRequantize: each from its decoded values', async () => {
    const dir = await tempDir();
    const src = join(dir, 'q8.gguf');
    await convertToGguf({ source: join(MODELS, 'tiny-shakespeare-qwen3'), out: src, type: 'Q8_0' });
    const out = join(dir, 'q4.gguf');
    const refused = await failure(requantizeGguf({ source: src, out, type: 'Q4_K_M' }));
    expect(refused).toBeInstanceOf(GgufError);
    expect(refused!.code).toBe('BAD_INPUT');
    expect(refused!.message).toMatch(/already quantized \(e\.g\. .*: Q8_0 → Q[46]_K\).*--allow-requantize/);
    expect(existsSync(out)).toBe(false);
    expect(readdirSync(dir)).toEqual(['q8.gguf']);

    await requantizeGguf({ source: src, out, type: 'Q4_K_M', allowRequantize: true });
    const [a, b] = await Promise.all([contents(src), contents(out)]);
    const q = b.tensors.find((t) => t.name === 'blk.1.ffn_up.weight')!;
    const from = a.tensors.find((t) => t.name === 'blk.1.ffn_up.weight')!;
    expect([from.type, q.type]).toEqual(['Q8_0', 'Q4_K']);
    const n = q.dims.reduce((x, y) => x * y, 1);
    const want = quantize('Q4_K', dequantize('Q8_0', new Uint8Array(from.bytes), n) as Float32Array);
    expect(q.bytes.equals(Buffer.from(want))).toBe(true);
    expect(b.metadata.get('general.file_type')).toEqual({ type: 'UINT32', value: 15 });
  });

  it('clear errors: a missing source, the source as output, an existing output; nothing written', async () => {
    const dir = await tempDir();
    const src = join(dir, 'f16.gguf');
    await convertToGguf({ source: join(MODELS, 'tiny-random-qwen3'), out: src, type: 'F16' });
    expect((await failure(requantizeGguf({ source: join(dir, 'none.gguf'), out: join(dir, 'x.gguf'), type: 'Q8_0' })))?.code).toBe('NOT_FOUND');
    expect((await failure(requantizeGguf({ source: src, out: src, type: 'Q8_0' })))?.code).toBe('BAD_INPUT');
    await convertToGguf({ source: src, out: join(dir, 'taken.gguf'), type: 'Q8_0' });
    expect((await failure(convertToGguf({ source: src, out: join(dir, 'taken.gguf'), type: 'Q4_0' })))?.code).toBe('EXISTS');
    expect(readdirSync(dir).sort()).toEqual(['f16.gguf', 'taken.gguf']);
  });
});
