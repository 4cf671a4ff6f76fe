import { cp, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { f32ToBf16, bf16ToF32 } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { Checkpoint, CheckpointError } from '../src/index.js';
import { MODELS, tempDir, writeSafetensors } from './helpers.js';

async function copyFixture(name: string): Promise<string> {
  const dir = join(await tempDir(), name);
  await cp(join(MODELS, name), dir, { recursive: true });
  return dir;
}

async function openErr(dir: string): Promise<CheckpointError> {
  const e = await Checkpoint.open(dir).then(
    () => undefined,
    (x: unknown) => x,
  );
  expect(e).toBeInstanceOf(CheckpointError);
  return e as CheckpointError;
}

describe('Checkpoint', () => {
  it('sharded bf16 fixture holds the single-file f32 llama weights rounded to bf16', async () => {
    const single = await Checkpoint.open(join(MODELS, 'tiny-random-llama'));
    const sharded = await Checkpoint.open(join(MODELS, 'tiny-random-llama-sharded'));
    try {
      expect(sharded.files.length).toBe(8);
      expect(single.files.length).toBe(1);
      expect(sharded.names().sort()).toEqual(single.names().sort());
      const index = JSON.parse(await readFile(join(MODELS, 'tiny-random-llama-sharded', 'model.safetensors.index.json'), 'utf8'));
      expect(sharded.totalBytes).toBe(index.metadata.total_size);
      expect(single.totalBytes).toBe(index.metadata.total_size * 2); // f32 vs bf16
      for (const name of single.names()) {
        const info = sharded.info(name);
        expect(info.dtype).toBe('BF16');
        expect(info.file.endsWith(index.weight_map[name])).toBe(true);
        expect(info.shape).toEqual(single.info(name).shape);
        const ref = await single.readF32(name);
        const got = await sharded.readF32(name);
        expect(got.length).toBe(ref.length);
        for (let i = 0; i < ref.length; i++) {
          if (got[i] !== bf16ToF32(f32ToBf16(ref[i]))) throw new Error(`${name}[${i}]: ${got[i]} vs bf16(${ref[i]})`);
        }
      }
    } finally {
      await single.close();
      await sharded.close();
    }
  });

  it('missing shard → MISSING_SHARD naming it', async () => {
    const dir = await copyFixture('tiny-random-llama-sharded');
    await rm(join(dir, 'model-00005-of-00008.safetensors'));
    const e = await openErr(dir);
    expect(e.code).toBe('MISSING_SHARD');
    expect(e.message).toContain('model-00005-of-00008.safetensors');
  });

  it('a mapped tensor absent from its shard → MISSING_TENSOR naming tensor and shard', async () => {
    const dir = await copyFixture('tiny-random-llama-sharded');
    const idxPath = join(dir, 'model.safetensors.index.json');
    const idx = JSON.parse(await readFile(idxPath, 'utf8'));
    const wrong = idx.weight_map['lm_head.weight'] === 'model-00001-of-00008.safetensors' ? 'model-00002-of-00008.safetensors' : 'model-00001-of-00008.safetensors';
    idx.weight_map['lm_head.weight'] = wrong;
    await writeFile(idxPath, JSON.stringify(idx));
    const e = await openErr(dir);
    expect(e.code).toBe('MISSING_TENSOR');
    expect(e.tensor).toBe('lm_head.weight');
    expect(e.file).toContain(wrong);
  });

  it('malformed index → BAD_INDEX (not JSON, no weight_map, path escaping the dir)', async () => {
    const dir = await copyFixture('tiny-random-llama-sharded');
    const idxPath = join(dir, 'model.safetensors.index.json');
    await writeFile(idxPath, '{"weight_map": ');
    expect((await openErr(dir)).code).toBe('BAD_INDEX');
    await writeFile(idxPath, '{"metadata": {}}');
    expect((await openErr(dir)).message).toContain('weight_map');
    await writeFile(idxPath, JSON.stringify({ weight_map: { 'a.weight': '../../etc/passwd' } }));
    const e = await openErr(dir);
    expect(e.code).toBe('BAD_INDEX');
    expect(e.message).toContain('outside');
  });

  it('a directory without weights → NOT_FOUND', async () => {
    const e = await openErr(await tempDir());
    expect(e.code).toBe('NOT_FOUND');
    expect(e.message).toContain('model.safetensors');
  });

  it('opens a single .safetensors file path and reports missing tensors', async () => {
    const dir = await tempDir();
    const p = await writeSafetensors(join(dir, 'x.safetensors'), { t: { dtype: 'F32', shape: [1], data_offsets: [0, 4] } }, new Uint8Array(Float32Array.from([7]).buffer));
    const ck = await Checkpoint.open(p);
    expect(ck.names()).toEqual(['t']);
    expect(Array.from(await ck.readF32('t'))).toEqual([7]);
    expect(() => ck.info('u')).toThrow(CheckpointError);
    await ck.close();
  });
});
