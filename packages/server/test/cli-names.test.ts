import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { hubRepoIdOf, modelNameOf } from '../src/cli-model.js';
import { FIXTURES, lastJson, nerva, nervaFails } from './cli-helpers.js';
import { hubSnapshot } from './hub-cache.js';

const tmp = mkdtempSync(join(tmpdir(), 'nerva-names-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const HUB = join(tmp, 'hub');
const LLAMA = hubSnapshot(HUB, 'nerva-test/tiny-random-llama', 'abc123', join(FIXTURES, 'models/tiny-random-llama'));
hubSnapshot(HUB, 'nerva-test/tiny-random-qwen3', 'def456', join(FIXTURES, 'models/tiny-random-qwen3'));
hubSnapshot(HUB, 'someone-else/tiny-random-qwen3', '789abc', join(FIXTURES, 'models/tiny-random-qwen3'));
const ENV = { HF_HUB_CACHE: HUB };
const RUN = ['run', '--prompt-ids', '1,2,3', '--max-tokens', '2', '--temperature', '0', '--backend', 'cpu', '--json'];

describe('--model names through the HF cache', () => {
  it('an Org/Name id and a short name resolve to the refs/main snapshot and run', async () => {
    const byId = lastJson((await nerva([...RUN, '--model', 'nerva-test/tiny-random-llama'], ENV)).stdout);
    expect(byId.model).toBe(LLAMA);
    const byName = lastJson((await nerva([...RUN, '--model', 'Tiny-Random-Llama'], ENV)).stdout);
    expect(byName.model).toBe(LLAMA);
    expect(byName.token_ids).toEqual(byId.token_ids);
    // The same through HF_HOME (its hub/ folder).
    mkdirSync(join(tmp, 'home'), { recursive: true });
    rmSync(join(tmp, 'home', 'hub'), { force: true });
    symlinkSync(HUB, join(tmp, 'home', 'hub'));
    const viaHome = lastJson((await nerva([...RUN, '--model', 'tiny-random-llama'], { HF_HOME: join(tmp, 'home'), HF_HUB_CACHE: '' })).stdout);
    expect(viaHome.model).toBe(join(tmp, 'home', 'hub', 'models--nerva-test--tiny-random-llama', 'snapshots', 'abc123'));
  });

  it('a missing model is one error listing every place it looked, before anything loads', async () => {
    const err = await nervaFails([...RUN, '--model', 'qwen3-8b'], ENV);
    expect(err?.code).toBe(1);
    expect(err?.stderr).toMatch(/^nerva: error: model "qwen3-8b" \(alias of Qwen\/Qwen3-8B\) not found locally/);
    expect(err?.stderr).toContain(join(HUB, 'models--Qwen--Qwen3-8B', 'snapshots'));
    expect(err?.stderr).toContain('never downloads');
    expect(err?.stderr).not.toContain('nerva: loading');
  });

  it('a short name two orgs share is an error naming both ids', async () => {
    const err = await nervaFails([...RUN, '--model', 'tiny-random-qwen3'], ENV);
    expect(err?.code).toBe(1);
    expect(err?.stderr).toContain('is ambiguous');
    expect(err?.stderr).toContain('nerva-test/tiny-random-qwen3, someone-else/tiny-random-qwen3');
  });

  it('nerva list shows the cached models and the embedded one, as a table and as JSON', async () => {
    const table = (await nerva(['list'], ENV)).stdout;
    const lines = table.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^NAME\s+SIZE\s+DTYPE\s+PATH$/);
    expect(lines.find((l) => l.startsWith('nerva-test/tiny-random-llama '))).toContain(LLAMA);
    expect(lines.some((l) => l.startsWith('tiny-shakespeare-qwen3 '))).toBe(true);
    const j = lastJson((await nerva(['list', '--json'], ENV)).stdout);
    expect(j.hub_cache).toBe(HUB);
    const names = j.models.map((m: { name: string }) => m.name);
    expect(names).toEqual(expect.arrayContaining(['nerva-test/tiny-random-llama', 'nerva-test/tiny-random-qwen3', 'someone-else/tiny-random-qwen3', 'tiny-shakespeare-qwen3']));
    const llama = j.models.find((m: { name: string }) => m.name === 'nerva-test/tiny-random-llama');
    expect(llama.bytes).toBeGreaterThan(100_000);
    expect(llama.source).toBe('hub-cache');
    // An empty cache: the embedded model still, and a note naming the cache.
    const empty = await nerva(['list'], { HF_HUB_CACHE: join(tmp, 'none') });
    expect(empty.stdout).toContain('tiny-shakespeare-qwen3');
    expect(empty.stderr).toContain(`no models in the Hugging Face cache ${join(tmp, 'none')}`);
  });

  it('the embedded model answers to its name', async () => {
    const j = lastJson((await nerva([...RUN, '--model', 'tiny-shakespeare-qwen3'], { HF_HUB_CACHE: join(tmp, 'none') })).stdout);
    expect(j.model).toMatch(/models[/\\]tiny-shakespeare-qwen3$/);
  });

  it('a hub snapshot is served under its repo id, not its commit hash', () => {
    expect(hubRepoIdOf(LLAMA)).toBe('nerva-test/tiny-random-llama');
    expect(modelNameOf(LLAMA)).toBe('nerva-test/tiny-random-llama');
    expect(modelNameOf(join(FIXTURES, 'models/tiny-random-llama'))).toBe('tiny-random-llama');
    expect(hubRepoIdOf(join(tmp, 'snapshots', 'x'))).toBeUndefined();
    expect(hubRepoIdOf(join(tmp, 'models--a--b--c', 'snapshots', 'x'))).toBeUndefined();
    // The fixture tokenizer files are read through the symlinks like any file.
    expect(readFileSync(join(LLAMA, 'config.json'), 'utf8')).toContain('llama');
  });
});
