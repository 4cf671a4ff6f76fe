import { readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { convertToGguf, GgufCheckpoint, GgufError, GgufFile, ggufSplitPath, ggufValue, requantizeGguf, writeGgufSplits, type GgufValue } from '../src/index.js';
import { MODELS, tempDir } from './helpers.js';

const failure = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => e as GgufError);

/** A one-tensor F32 file of `n` values with these metadata entries. */
function tensor(name: string, n: number) {
  return { name, type: 'F32' as const, dims: [n], data: async () => new Uint8Array(new Float32Array(n).fill(1).buffer) };
}
const split = (no: number, count: number, total: number): [string, GgufValue][] => [
  ['split.no', ggufValue.u16(no)],
  ['split.count', ggufValue.u16(count)],
  ['split.tensors.count', ggufValue.i32(total)],
];

describe("split GGUF models (llama.cpp's gguf-split form)", () => {
  it('a model written in splits opens from its first file with every tensor, byte for byte, and the metadata', async () => {
    const dir = await tempDir();
    const whole = join(dir, 'whole.gguf');
    await convertToGguf({ source: join(MODELS, 'tiny-shakespeare-qwen3'), out: whole, type: 'Q8_0' });
    const r = await convertToGguf({ source: join(MODELS, 'tiny-shakespeare-qwen3'), out: join(dir, 'm.gguf'), type: 'Q8_0', splitMaxBytes: 1 << 20 });
    expect(r.files.length).toBeGreaterThan(2);
    expect(r.files).toEqual(r.files.map((_, i) => ggufSplitPath(join(dir, 'm.gguf'), i, r.files.length)));
    expect(r.out).toBe(join(dir, `m-00001-of-${String(r.files.length).padStart(5, '0')}.gguf`));
    expect(readdirSync(dir).sort()).toEqual(['whole.gguf', ...r.files.map((f) => f.slice(dir.length + 1))].sort());
    const a = await GgufFile.open(whole);
    const b = await GgufFile.open(r.out);
    try {
      expect(b.paths).toEqual(r.files);
      expect(b.tensors.map((t) => [t.name, t.type, t.dims])).toEqual(a.tensors.map((t) => [t.name, t.type, t.dims]));
      for (const t of a.tensors) expect(Buffer.from(await b.readTensor(t.name)).equals(Buffer.from(await a.readTensor(t.name))), t.name).toBe(true);
      expect(new Set(b.tensors.map((t) => b.pathOf(t.name))).size).toBe(r.files.length);
      const meta = new Map(b.metadata);
      expect(meta.get('split.count')).toEqual({ type: 'UINT16', value: r.files.length });
      for (const k of ['split.no', 'split.count', 'split.tensors.count']) meta.delete(k);
      expect(meta).toEqual(new Map(a.metadata));
    } finally {
      await a.close();
      await b.close();
    }
    // Served by HF name as the whole file is, each tensor's file named.
    const ck = await GgufCheckpoint.open(r.out);
    try {
      expect(ck.spec.numLayers).toBe(6);
      const last = ck.info('model.norm.weight');
      expect(last.file).toBe(r.files.at(-1));
    } finally {
      await ck.close();
    }
    // Written again as one file from the splits: the file a direct conversion writes.
    const again = await requantizeGguf({ source: r.out, out: join(dir, 'again.gguf'), type: 'Q8_0' });
    expect(again.files).toEqual([join(dir, 'again.gguf')]);
    const [x, y] = [await GgufFile.open(whole), await GgufFile.open(again.out)];
    try {
      expect(new Map(y.metadata)).toEqual(new Map(x.metadata));
      for (const t of x.tensors) expect(Buffer.from(await y.readTensor(t.name)).equals(Buffer.from(await x.readTensor(t.name))), t.name).toBe(true);
    } finally {
      await x.close();
      await y.close();
    }
  });

  it('a model that fits under the limit is one file, without split keys', async () => {
    const dir = await tempDir();
    const r = await writeGgufSplits(join(dir, 'one.gguf'), { metadata: [], tensors: [tensor('a', 8), tensor('b', 8)], splitMaxBytes: 1 << 20 });
    expect(r.paths).toEqual([join(dir, 'one.gguf')]);
    const f = await GgufFile.open(r.paths[0]);
    expect(f.get('split.count')).toBeUndefined();
    await f.close();
  });

  it('clear errors: a split other than the first, a missing split, keys that disagree, a tensor in two splits', async () => {
    const dir = await tempDir();
    const p = (i: number, n: number) => ggufSplitPath(join(dir, 'x.gguf'), i, n);
    const write = (path: string, meta: [string, GgufValue][], names: string[]) => writeGgufSplits(path, { metadata: meta, tensors: names.map((n) => tensor(n, 8)) });
    await write(p(0, 3), split(0, 3, 3), ['a']);
    await write(p(1, 3), split(1, 3, 3), ['b']);
    const missing = await failure(GgufFile.open(p(0, 3)));
    expect(missing?.code).toBe('NOT_FOUND');
    expect(missing?.message).toContain('x-00003-of-00003.gguf');
    await write(p(2, 3), split(2, 3, 3), ['c']);
    const ok = await GgufFile.open(p(0, 3));
    expect(ok.tensors.map((t) => t.name)).toEqual(['a', 'b', 'c']);
    await ok.close();
    const second = await failure(GgufFile.open(p(1, 3)));
    expect([second?.code, second?.message]).toEqual(['BAD_METADATA', expect.stringMatching(/open the first split/)]);
    await writeGgufSplits(p(2, 3), { metadata: split(1, 3, 3), tensors: [tensor('c', 8)], overwrite: true });
    expect((await failure(GgufFile.open(p(0, 3))))?.code).toBe('BAD_METADATA');
    await writeGgufSplits(p(2, 3), { metadata: split(2, 3, 3), tensors: [tensor('a', 8)], overwrite: true });
    expect((await failure(GgufFile.open(p(0, 3))))?.code).toBe('DUPLICATE_TENSOR');
    await writeGgufSplits(p(2, 3), { metadata: split(2, 3, 3), tensors: [tensor('c', 8), tensor('d', 8)], overwrite: true });
    const count = await failure(GgufFile.open(p(0, 3)));
    expect([count?.code, count?.message]).toEqual(['BAD_METADATA', expect.stringMatching(/split\.tensors\.count is 3, the splits hold 4/)]);
  });

  it('bad split options are refused before anything is written', async () => {
    const dir = await tempDir();
    const tensors = [tensor('a', 1024), tensor('b', 1024)];
    for (const bad of [0, -1, 1.5]) expect((await failure(writeGgufSplits(join(dir, 'y.gguf'), { metadata: [], tensors, splitMaxBytes: bad })))?.code).toBe('BAD_INPUT');
    expect((await failure(writeGgufSplits(join(dir, 'y.bin'), { metadata: [], tensors, splitMaxBytes: 4096 })))?.code).toBe('BAD_INPUT');
    // The second split exists: the first, written before it was reached, is removed again.
    writeFileSync(ggufSplitPath(join(dir, 'y.gguf'), 1, 2), 'precious');
    expect((await failure(writeGgufSplits(join(dir, 'y.gguf'), { metadata: [], tensors, splitMaxBytes: 4096 })))?.code).toBe('EXISTS');
    expect(readdirSync(dir)).toEqual(['y-00002-of-00002.gguf']);
  });
});
