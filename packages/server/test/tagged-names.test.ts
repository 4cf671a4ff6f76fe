import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { convertToGguf } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI, FIXTURES, lastJson, nerva, nervaFails, ROOT } from './cli-helpers.js';

const tmp = mkdtempSync(join(tmpdir(), 'nerva-ollama-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const STORE = join(tmp, 'ollama');
const GGUF = join(tmp, 'shakespeare-q8.gguf');
const HUB = join(tmp, 'hub');
const ENV = { OLLAMA_MODELS: STORE, HF_HUB_CACHE: HUB };
const RUN = ['run', '--backend', 'cpu', '--prompt', 'ROMEO:', '--max-tokens', '6', '--temperature', '0', '--json'];

// The layout `ollama pull` leaves: a manifest naming the model layer's sha256, the GGUF file as that blob.
beforeAll(async () => {
  await convertToGguf({ source: join(FIXTURES, 'models', 'tiny-shakespeare-qwen3'), out: GGUF, type: 'Q8_0' });
  const bytes = readFileSync(GGUF);
  const hex = createHash('sha256').update(bytes).digest('hex');
  mkdirSync(join(STORE, 'blobs'), { recursive: true });
  copyFileSync(GGUF, join(STORE, 'blobs', `sha256-${hex}`));
  mkdirSync(join(STORE, 'manifests', 'registry.ollama.ai', 'library', 'shakespeare'), { recursive: true });
  const layers = [{ mediaType: 'application/vnd.ollama.image.model', digest: `sha256:${hex}`, size: bytes.byteLength }];
  writeFileSync(join(STORE, 'manifests', 'registry.ollama.ai', 'library', 'shakespeare', 'q8'), JSON.stringify({ schemaVersion: 2, layers }));
  // A GGUF repository in the HF cache, as huggingface-cli download leaves it (files, refs/main).
  const repo = join(HUB, 'models--someone--Bard-GGUF');
  mkdirSync(join(repo, 'snapshots', 'r1'), { recursive: true });
  mkdirSync(join(repo, 'refs'));
  copyFileSync(GGUF, join(repo, 'snapshots', 'r1', 'Bard-Q8_0.gguf'));
  writeFileSync(join(repo, 'refs', 'main'), 'r1');
});

describe("--model takes Ollama's names and GGUF repositories' Org/Repo:QUANT", () => {
  it('nerva run --model shakespeare:q8 runs the blob Ollama pulled, as the GGUF file itself runs', async () => {
    const a = lastJson((await nerva([...RUN, '--model', GGUF], ENV)).stdout);
    const b = lastJson((await nerva([...RUN, '--model', 'shakespeare:q8'], ENV)).stdout);
    expect(b.token_ids).toEqual(a.token_ids);
    expect(b.text).toBe(a.text);
    const missing = await nervaFails([...RUN, '--model', 'shakespeare:q4'], ENV);
    expect(missing?.stderr).toMatch(/model "shakespeare:q4" not found among Ollama's models/);
    expect(missing?.stderr).toContain(join(STORE, 'manifests', 'registry.ollama.ai', 'library', 'shakespeare', 'q4'));
  });

  it('nerva list shows it by its Ollama name', async () => {
    const j = lastJson((await nerva(['list', '--json'], ENV)).stdout);
    expect(j.ollama_models).toEqual([STORE]);
    const m = j.models.find((x: { name: string }) => x.name === 'shakespeare:q8');
    expect(m).toMatchObject({ source: 'ollama', bytes: readFileSync(GGUF).byteLength });
  });

  it('nerva serve serves it, and a GGUF repository file named Org/Repo:QUANT, under those names', async () => {
    const child = spawn(process.execPath, [CLI, 'serve', '--backend', 'cpu', '--port', '0', '--model', 'shakespeare:q8', '--model', 'someone/Bard-GGUF:Q8_0'], { cwd: ROOT, env: { ...process.env, ...ENV }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    try {
      let url: string | undefined;
      for (let i = 0; i < 600 && !url; i++) {
        url = /nerva: ready at (http:\/\/\S+)\/v1/.exec(out)?.[1];
        if (!url) await new Promise((r) => setTimeout(r, 100));
      }
      expect(url, out).toBeDefined();
      const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id).sort()).toEqual(['shakespeare:q8', 'someone/Bard-GGUF:Q8_0']);
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      child.kill('SIGKILL');
    }
  }, 90_000);
});
