import { copyFile, mkdir, readdir, symlink, utimes, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  AmbiguousModelError,
  CheckpointError,
  ConfigError,
  hfHubCacheDir,
  listLocalModels,
  loadModelDir,
  resolveModelDir,
  ResolveError,
} from '../src/index.js';
import { MODELS, tempDir } from './helpers.js';

/**
 * A snapshot as huggingface_hub lays it out: the files are blobs named by their hash under
 * `blobs/`, and `snapshots/<rev>/<file>` are relative symlinks to them; `refs/main` names the rev.
 */
async function hubSnapshot(hub: string, repo: string, rev: string, from: string): Promise<string> {
  const repoDir = join(hub, `models--${repo.replace('/', '--')}`);
  const snap = join(repoDir, 'snapshots', rev);
  await mkdir(snap, { recursive: true });
  await mkdir(join(repoDir, 'blobs'), { recursive: true });
  await mkdir(join(repoDir, 'refs'), { recursive: true });
  let i = 0;
  for (const f of await readdir(from)) {
    const blob = join(repoDir, 'blobs', `${rev}${(i++).toString(16).padStart(8, '0')}`);
    await copyFile(join(from, f), blob);
    await symlink(relative(snap, blob), join(snap, f));
  }
  await writeFile(join(repoDir, 'refs', 'main'), rev);
  return snap;
}

async function snapshot(hub: string, repo: string, rev: string, withConfig = true): Promise<string> {
  const dir = join(hub, `models--${repo.replace('/', '--')}`, 'snapshots', rev);
  await mkdir(dir, { recursive: true });
  if (withConfig) await writeFile(join(dir, 'config.json'), '{}');
  return dir;
}

describe('resolveModelDir', () => {
  it('accepts a local model directory as is', async () => {
    const dir = join(MODELS, 'tiny-random-qwen2');
    expect(await resolveModelDir(dir)).toBe(dir);
  });

  it('finds the refs/main snapshot in $HF_HOME/hub, by repo id and by alias', async () => {
    const home = await tempDir();
    const hub = join(home, 'hub');
    await snapshot(hub, 'Qwen/Qwen3-8B', 'aaaa');
    const main = await snapshot(hub, 'Qwen/Qwen3-8B', 'bbbb');
    await mkdir(join(hub, 'models--Qwen--Qwen3-8B', 'refs'), { recursive: true });
    await writeFile(join(hub, 'models--Qwen--Qwen3-8B', 'refs', 'main'), 'bbbb\n');
    const env = { HF_HOME: home };
    expect(hfHubCacheDir(env)).toBe(hub);
    expect(await resolveModelDir('Qwen/Qwen3-8B', { env })).toBe(main);
    expect(await resolveModelDir('qwen3-8b', { env })).toBe(main);
    expect(await resolveModelDir('Qwen3-8B', { env })).toBe(main); // alias lookup is case-insensitive
  });

  it('without refs/main, takes the newest snapshot that has a config.json', async () => {
    const hub = await tempDir();
    const old = await snapshot(hub, 'meta-llama/Llama-3.2-1B', 'old');
    const neu = await snapshot(hub, 'meta-llama/Llama-3.2-1B', 'new');
    await snapshot(hub, 'meta-llama/Llama-3.2-1B', 'partial', false);
    await utimes(join(old, 'config.json'), new Date(1000), new Date(1000));
    expect(await resolveModelDir('llama-3.2-1b', { env: { HF_HUB_CACHE: hub } })).toBe(neu);
  });

  it('searchDirs: <dir>/<name> and <dir>/<Org>/<Name>', async () => {
    expect(await resolveModelDir('tiny-random-llama', { searchDirs: [MODELS], env: {} })).toBe(join(MODELS, 'tiny-random-llama'));
    const base = await tempDir();
    await mkdir(join(base, 'Qwen', 'Qwen3-0.6B'), { recursive: true });
    await writeFile(join(base, 'Qwen', 'Qwen3-0.6B', 'config.json'), '{}');
    expect(await resolveModelDir('qwen3-0.6b', { searchDirs: [base], env: { HF_HUB_CACHE: join(base, 'none') } })).toBe(join(base, 'Qwen', 'Qwen3-0.6B'));
  });

  it('not found: a ResolveError listing every place it looked', async () => {
    const hub = await tempDir();
    const e = await resolveModelDir('qwen3-14b', { searchDirs: ['/nonexistent/models'], env: { HF_HUB_CACHE: hub } }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ResolveError);
    const msg = (e as ResolveError).message;
    expect(msg).toContain('Qwen/Qwen3-14B');
    expect(msg).toContain('/nonexistent/models/qwen3-14b');
    expect(msg).toContain(join(hub, 'models--Qwen--Qwen3-14B', 'snapshots'));
    expect(msg).toContain('never downloads');
    const p = await resolveModelDir('./no/such/dir').catch((x: unknown) => x);
    expect(p).toBeInstanceOf(ResolveError);
    expect((p as ResolveError).message).toContain('not a model directory');
    const bare = await resolveModelDir('some-unknown-model', { env: { HF_HUB_CACHE: hub } }).catch((x: unknown) => x);
    expect(bare).toBeInstanceOf(ResolveError);
    expect((bare as ResolveError).code).toBe('MODEL_NOT_FOUND');
    expect((bare as ResolveError).message).toContain('no repository named "some-unknown-model"');
  });

  it('resolves through a hub cache whose snapshot files are symlinks to blobs, by id and by short name', async () => {
    const hub = await tempDir();
    const snap = await hubSnapshot(hub, 'nerva-test/Tiny-Random-Qwen3', 'c0ffee', join(MODELS, 'tiny-random-qwen3'));
    const env = { HF_HUB_CACHE: hub };
    expect(await resolveModelDir('nerva-test/Tiny-Random-Qwen3', { env })).toBe(snap);
    // The short name is the repo name without its org, any case; it need not be a known alias.
    expect(await resolveModelDir('tiny-random-qwen3', { env, cwd: hub })).toBe(snap);
    // The snapshot loads: the symlinked safetensors and config are followed.
    const m = await loadModelDir(await resolveModelDir('TINY-RANDOM-QWEN3', { env, cwd: hub }));
    expect(m.spec.arch).toBe('qwen3');
    await m.checkpoint.close();
  });

  it('a short name two orgs share in the cache is an AmbiguousModelError naming both', async () => {
    const hub = await tempDir();
    await snapshot(hub, 'Qwen/Qwen3-8B', 'a');
    await snapshot(hub, 'someone/Qwen3-8B', 'b');
    const e = await resolveModelDir('qwen3-8b', { env: { HF_HUB_CACHE: hub } }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(AmbiguousModelError);
    expect((e as AmbiguousModelError).code).toBe('MODEL_AMBIGUOUS');
    expect((e as AmbiguousModelError).candidates).toEqual(['Qwen/Qwen3-8B', 'someone/Qwen3-8B']);
    expect((e as Error).message).toContain('pass one of these Org/Name ids');
    // The full id is not ambiguous.
    expect(await resolveModelDir('someone/Qwen3-8B', { env: { HF_HUB_CACHE: hub } })).toBe(join(hub, 'models--someone--Qwen3-8B', 'snapshots', 'b'));
  });

  it('relative paths resolve against the given cwd, not the process directory', async () => {
    const base = await tempDir();
    await mkdir(join(base, 'sub', 'my-model'), { recursive: true });
    await writeFile(join(base, 'sub', 'my-model', 'config.json'), '{}');
    const env = { HF_HUB_CACHE: join(base, 'none') };
    expect(await resolveModelDir('./my-model', { cwd: join(base, 'sub'), env })).toBe(join(base, 'sub', 'my-model'));
    expect(await resolveModelDir('my-model', { cwd: join(base, 'sub'), env })).toBe(join(base, 'sub', 'my-model'));
    expect(await resolveModelDir('sub/my-model', { cwd: base, env })).toBe(join(base, 'sub', 'my-model'));
    const e = await resolveModelDir('./my-model', { cwd: base, env }).catch((x: unknown) => x);
    expect((e as ResolveError).searched).toEqual([join(base, 'my-model')]);
  });

  it('the cache directory follows HF_HUB_CACHE, then HF_HOME, then the default path', () => {
    expect(hfHubCacheDir({ HF_HUB_CACHE: '/a/hub', HF_HOME: '/b' })).toBe('/a/hub');
    expect(hfHubCacheDir({ HF_HOME: '/b' })).toBe('/b/hub');
    expect(hfHubCacheDir({ HF_HOME: '~/hf' })).toBe(join(homedir(), 'hf', 'hub'));
    expect(hfHubCacheDir({})).toBe(join(homedir(), '.cache', 'huggingface', 'hub'));
  });

  it('a missing model lists the search folders, the HF cache snapshot path, and that nothing is downloaded', async () => {
    const home = await tempDir();
    const e = await resolveModelDir('Qwen/Qwen3-4B', { searchDirs: [join(home, 'models')], env: { HF_HOME: home, OLLAMA_MODELS: join(home, 'ollama') }, cwd: home }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ResolveError);
    expect((e as ResolveError).searched).toEqual([
      join(home, 'Qwen/Qwen3-4B') + ' (no such folder)',
      join(home, 'models', 'Qwen/Qwen3-4B'),
      join(home, 'models', 'Qwen3-4B'),
      join(home, 'models', 'models--Qwen--Qwen3-4B', 'snapshots') + '/<rev>/',
      join(home, 'hub', 'models--Qwen--Qwen3-4B', 'snapshots') + '/<rev>/',
      join(home, 'hub', 'models--Qwen--Qwen3-4B', 'snapshots') + '/<rev>/ (a .gguf file)',
      // Last, Ollama's `latest` of that name.
      join(home, 'ollama', 'manifests', 'registry.ollama.ai', 'Qwen', 'Qwen3-4B', 'latest'),
    ]);
  });
});

describe('listLocalModels', () => {
  it('lists hub cache snapshots and search-folder models with size and dtype', async () => {
    const hub = await tempDir();
    const snap = await hubSnapshot(hub, 'nerva-test/tiny-random-llama', 'r1', join(MODELS, 'tiny-random-llama'));
    await snapshot(hub, 'nerva-test/partial', 'r2', false); // no config.json: not listed
    await mkdir(join(hub, 'datasets--x--y'), { recursive: true }); // not a model: not listed
    const list = await listLocalModels({ env: { HF_HUB_CACHE: hub }, searchDirs: [MODELS] });
    const llama = list.find((m) => m.name === 'nerva-test/tiny-random-llama');
    expect(llama).toMatchObject({ path: snap, source: 'hub-cache' });
    expect(llama!.bytes).toBeGreaterThan(100_000);
    expect(list.some((m) => m.name === 'nerva-test/partial')).toBe(false);
    const shakespeare = list.find((m) => m.name === 'tiny-shakespeare-qwen3');
    expect(shakespeare).toMatchObject({ path: join(MODELS, 'tiny-shakespeare-qwen3'), source: 'search-dir' });
    expect(typeof shakespeare!.dtype).toBe('string');
    expect(list.map((m) => m.name)).toEqual([...list.map((m) => m.name)].sort((a, b) => a.localeCompare(b)));
  });

  it('takes the dtype from config.json, else from the safetensors header', async () => {
    const base = await tempDir();
    const a = join(base, 'a');
    const b = join(base, 'b');
    await mkdir(a);
    await mkdir(b);
    await writeFile(join(a, 'config.json'), JSON.stringify({ torch_dtype: 'bfloat16' }));
    await writeFile(join(b, 'config.json'), '{}');
    const header = Buffer.from(JSON.stringify({ w: { dtype: 'F16', shape: [2], data_offsets: [0, 4] } }));
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(header.length));
    await writeFile(join(b, 'model.safetensors'), Buffer.concat([len, header, Buffer.alloc(4)]));
    const list = await listLocalModels({ env: { HF_HUB_CACHE: join(base, 'none') }, searchDirs: [base] });
    expect(list.map((m) => [m.name, m.dtype])).toEqual([
      ['a', 'bfloat16'],
      ['b', 'F16'],
    ]);
  });
});

describe('loadModelDir', () => {
  it('loads spec, checkpoint, weights, tokenizer and generation config of the shakespeare model', async () => {
    const m = await loadModelDir(join(MODELS, 'tiny-shakespeare-qwen3'));
    try {
      expect(m.spec.arch).toBe('qwen3');
      expect(m.weights.tiedLmHead).toBe(true);
      expect(m.weights.layers.length).toBe(6);
      expect(m.tokenizer?.vocabSize).toBe(4096);
      expect(m.generationConfig).toMatchObject({ top_k: 40, temperature: 0.8 });
      expect(m.stopTokenIds).toEqual([0]);
      const emb = await m.checkpoint.readF32(m.weights.embed.name);
      expect(emb.length).toBe(4096 * 256);
    } finally {
      await m.checkpoint.close();
    }
  });

  it('works without tokenizer files and surfaces typed errors', async () => {
    const m = await loadModelDir(join(MODELS, 'tiny-random-qwen3-moe'));
    expect(m.tokenizer).toBeUndefined();
    expect(m.generationConfig).toBeUndefined();
    expect(m.stopTokenIds).toEqual([2]);
    await m.checkpoint.close();
    const empty = await tempDir();
    await expect(loadModelDir(empty)).rejects.toBeInstanceOf(ConfigError);
    await writeFile(join(empty, 'config.json'), JSON.stringify({ model_type: 'llama', vocab_size: 4, hidden_size: 4, intermediate_size: 4, num_hidden_layers: 1, num_attention_heads: 1 }));
    await expect(loadModelDir(empty)).rejects.toBeInstanceOf(CheckpointError);
  });
});
