import { mkdir, readFile, symlink, writeFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { convertToGguf, listLocalModels, loadModelDir, resolveModelDir, ResolveError } from '../src/index.js';
import { MODELS, tempDir } from './helpers.js';

/** A GGUF repository as huggingface_hub caches it: snapshot files linked to blobs. */
async function ggufRepo(hub: string, repo: string, rev: string, files: Record<string, string>): Promise<string> {
  const repoDir = join(hub, `models--${repo.replace('/', '--')}`);
  const snap = join(repoDir, 'snapshots', rev);
  await mkdir(join(repoDir, 'blobs'), { recursive: true });
  await mkdir(join(repoDir, 'refs'), { recursive: true });
  let i = 0;
  for (const [name, from] of Object.entries(files)) {
    const blob = join(repoDir, 'blobs', `b${i++}`);
    await mkdir(join(snap, name, '..'), { recursive: true });
    // An absolute path: that file's bytes; else the text itself.
    await writeFile(blob, from.startsWith('/') ? await readFile(from) : from);
    await symlink(relative(join(snap, name, '..'), blob), join(snap, name));
  }
  await writeFile(join(repoDir, 'refs', 'main'), rev);
  return snap;
}

describe('GGUF repositories in the HF cache, by Org/Repo[:QUANT]', () => {
  it('names a file by its quantization, the only file or the Q4_K_M one without, and lists each', async () => {
    const hub = await tempDir();
    const q8 = join(hub, 'q8.gguf');
    await convertToGguf({ source: join(MODELS, 'tiny-shakespeare-qwen3'), out: q8, type: 'Q8_0' });
    const snap = await ggufRepo(hub, 'someone/Bard-GGUF', 'r1', {
      'Bard-Q8_0.gguf': q8,
      'Bard-Q4_K_M.gguf': q8,
      'Bard-IQ4_XS.gguf': q8,
      'mmproj-Bard-F16.gguf': 'not a model',
      'Bard-BF16/Bard-BF16-00001-of-00002.gguf': q8,
      'Bard-BF16/Bard-BF16-00002-of-00002.gguf': 'rest',
    });
    await ggufRepo(hub, 'someone/Solo-GGUF', 'r2', { 'solo.Q6_K.gguf': q8 });
    const env = { HF_HUB_CACHE: hub, OLLAMA_MODELS: join(hub, 'no-ollama') };
    expect(await resolveModelDir('someone/Bard-GGUF:q8_0', { env })).toBe(join(snap, 'Bard-Q8_0.gguf'));
    expect(await resolveModelDir('someone/Bard-GGUF:IQ4_XS', { env })).toBe(join(snap, 'Bard-IQ4_XS.gguf'));
    expect(await resolveModelDir('someone/Bard-GGUF:BF16', { env })).toBe(join(snap, 'Bard-BF16', 'Bard-BF16-00001-of-00002.gguf'));
    expect(await resolveModelDir('someone/Bard-GGUF', { env })).toBe(join(snap, 'Bard-Q4_K_M.gguf'));
    expect(await resolveModelDir('bard-gguf', { env })).toBe(join(snap, 'Bard-Q4_K_M.gguf'));
    expect(await resolveModelDir('someone/Solo-GGUF', { env })).toMatch(/solo\.Q6_K\.gguf$/);
    const m = await loadModelDir(await resolveModelDir('someone/Bard-GGUF:Q8_0', { env }));
    expect(m.spec.numLayers).toBe(6);
    await m.checkpoint.close();
    const listed = (await listLocalModels({ env })).filter((x) => x.name.startsWith('someone/'));
    expect(listed.map((x) => x.name)).toEqual(['someone/Bard-GGUF:BF16', 'someone/Bard-GGUF:IQ4_XS', 'someone/Bard-GGUF:Q4_K_M', 'someone/Bard-GGUF:Q8_0', 'someone/Solo-GGUF:Q6_K']);
    expect(listed.every((x) => x.dtype === 'Q8_0')).toBe(true); // every file here is a copy of the Q8_0 one
    const bf16 = listed.find((x) => x.name.endsWith(':BF16'))!;
    expect(bf16.bytes).toBe(listed.find((x) => x.name.endsWith(':Q8_0'))!.bytes + 4);
  });

  it('a quantization the repository lacks, or one that names several files, is a clear error', async () => {
    const hub = await tempDir();
    await ggufRepo(hub, 'someone/Two-GGUF', 'r1', { 'Two-Q4_0.gguf': 'x', 'Two-Q5_0.gguf': 'y', 'a/Two-Q5_0.gguf': 'z' });
    const env = { HF_HUB_CACHE: hub, OLLAMA_MODELS: join(hub, 'no-ollama') };
    const none = (await resolveModelDir('someone/Two-GGUF:Q8_0', { env }).catch((e: unknown) => e)) as ResolveError;
    expect(none).toBeInstanceOf(ResolveError);
    expect(none.message).toMatch(/holds no Q8_0 file \(Two-Q4_0\.gguf, Two-Q5_0\.gguf, a\/Two-Q5_0\.gguf\)/);
    const two = (await resolveModelDir('someone/Two-GGUF:Q5_0', { env }).catch((e: unknown) => e)) as ResolveError;
    expect(two.message).toMatch(/"Q5_0" names several files/);
    const noDefault = (await resolveModelDir('someone/Two-GGUF', { env }).catch((e: unknown) => e)) as ResolveError;
    expect(noDefault.message).toMatch(/holds no Q4_K_M file .*name one with :QUANT/);
    // Files that are not GGUF are listed without a dtype (loading one says what is wrong).
    const listed = await listLocalModels({ env });
    expect(listed.filter((x) => x.name.startsWith('someone/Two-GGUF:')).map((x) => x.dtype)).toEqual([undefined, undefined, undefined]);
  });
});
