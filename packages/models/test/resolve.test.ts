import { mkdir, utimes, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { hfHubCacheDir, loadModelDir, resolveModelDir, ResolveError, ConfigError, CheckpointError } from '../src/index.js';
import { MODELS, tempDir } from './helpers.js';

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
    expect((bare as ResolveError).message).toContain('neither an alias');
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
