import { createHash } from 'node:crypto';
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { convertToGguf, formatOllamaName, GgufFile, isGgufPath, isOllamaBlob, listLocalModels, loadModelDir, ollamaParamsOf, parseOllamaName, resolveModelDir, ResolveError } from '../src/index.js';
import { MODELS, tempDir } from './helpers.js';

/** An Ollama models folder as `ollama pull` leaves it: a manifest per name, content-addressed blobs. */
let store: string;
let blob: string;
const env = () => ({ OLLAMA_MODELS: store, HF_HUB_CACHE: join(store, 'no-hub') });

function pulled(host: string, namespace: string, model: string, tag: string, layers: unknown[]): void {
  const dir = join(store, 'manifests', host, namespace, model);
  mkdirSync(dir, { recursive: true });
  const manifest = { schemaVersion: 2, mediaType: 'application/vnd.docker.distribution.manifest.v2+json', config: { mediaType: 'application/vnd.docker.container.image.v1+json', digest: `sha256:${'0'.repeat(64)}`, size: 2 }, layers };
  writeFileSync(join(dir, tag), JSON.stringify(manifest));
}

beforeAll(async () => {
  store = await tempDir();
  const gguf = join(store, 'src.gguf');
  await convertToGguf({ source: join(MODELS, 'tiny-shakespeare-qwen3'), out: gguf, type: 'Q8_0' });
  const bytes = readFileSync(gguf);
  const hex = createHash('sha256').update(bytes).digest('hex');
  mkdirSync(join(store, 'blobs'));
  blob = join(store, 'blobs', `sha256-${hex}`);
  copyFileSync(gguf, blob);
  const model = { mediaType: 'application/vnd.ollama.image.model', digest: `sha256:${hex}`, size: bytes.byteLength };
  const template = { mediaType: 'application/vnd.ollama.image.template', digest: `sha256:${'1'.repeat(64)}`, size: 10 };
  pulled('registry.ollama.ai', 'library', 'shakespeare', 'q8', [model, template]);
  pulled('registry.ollama.ai', 'library', 'shakespeare', 'latest', [model]);
  pulled('registry.ollama.ai', 'someone', 'bard', 'v1', [model]);
  pulled('hf.co', 'nerva-test', 'Shakespeare-GGUF', 'Q8_0', [model]);
  pulled('registry.ollama.ai', 'library', 'broken', 'latest', [{ ...model, size: 5 }]);
  pulled('registry.ollama.ai', 'library', 'gone', 'latest', [{ ...model, digest: `sha256:${'2'.repeat(64)}` }]);
  pulled('registry.ollama.ai', 'library', 'embedder', 'latest', [template]);
  writeFileSync(join(store, 'manifests', 'registry.ollama.ai', 'library', 'shakespeare', 'bad'), '{not json');
});

describe("Ollama's models by Ollama's names", () => {
  it('names parse as Ollama parses them, defaults filled in', () => {
    expect(parseOllamaName('qwen3:8b')).toEqual({ host: 'registry.ollama.ai', namespace: 'library', model: 'qwen3', tag: '8b' });
    expect(parseOllamaName('qwen3')).toEqual({ host: 'registry.ollama.ai', namespace: 'library', model: 'qwen3', tag: 'latest' });
    expect(parseOllamaName('hf.co/bartowski/Qwen3-8B-GGUF:Q4_K_M')).toEqual({ host: 'hf.co', namespace: 'bartowski', model: 'Qwen3-8B-GGUF', tag: 'Q4_K_M' });
    for (const bad of ['a/b/c/d', ':x', 'a:', 'a b:c', '../x:y']) expect(parseOllamaName(bad), bad).toBeUndefined();
    expect(formatOllamaName(parseOllamaName('someone/bard:v1')!)).toBe('someone/bard:v1');
    expect(formatOllamaName(parseOllamaName('qwen3')!)).toBe('qwen3:latest');
  });

  it('a name with a tag resolves to the GGUF blob, which loads as a GGUF file (no .gguf extension)', async () => {
    const found = await resolveModelDir('shakespeare:q8', { env: env() });
    expect(found).toBe(blob);
    expect(isOllamaBlob(found) && isGgufPath(found)).toBe(true);
    expect(await resolveModelDir('someone/bard:v1', { env: env() })).toBe(blob);
    expect(await resolveModelDir('hf.co/nerva-test/Shakespeare-GGUF:Q8_0', { env: env() })).toBe(blob);
    // Without a tag: `latest`, once the HF cache has nothing of that name.
    expect(await resolveModelDir('shakespeare', { env: env() })).toBe(blob);
    const m = await loadModelDir(found);
    try {
      expect(m.spec.numLayers).toBe(6);
      expect(m.tokenizer?.encode('ROMEO:').length).toBeGreaterThan(0);
    } finally {
      await m.checkpoint.close();
    }
  });

  it('a missing name lists the manifests looked at; a broken pull says what is wrong', async () => {
    const missing = (await resolveModelDir('shakespeare:q4', { env: env() }).catch((e: unknown) => e)) as ResolveError;
    expect(missing).toBeInstanceOf(ResolveError);
    expect(missing.message).toMatch(/not found among Ollama's models/);
    expect(missing.message).toContain(join(store, 'manifests', 'registry.ollama.ai', 'library', 'shakespeare', 'q4'));
    const cases: [string, RegExp][] = [
      ['broken:latest', /bytes, the manifest says 5/],
      ['gone:latest', /model blob the manifest names is missing/],
      ['embedder:latest', /no layer of type application\/vnd\.ollama\.image\.model/],
      ['shakespeare:bad', /not a readable JSON manifest/],
    ];
    for (const [name, why] of cases) {
      const e = (await resolveModelDir(name, { env: env() }).catch((x: unknown) => x)) as Error;
      expect(e, name).toBeInstanceOf(ResolveError);
      expect(e.message, name).toMatch(why);
    }
  });

  it('listLocalModels lists every usable pull under its Ollama name', async () => {
    const listed = (await listLocalModels({ env: env() })).filter((m) => m.source === 'ollama');
    expect(listed.map((m) => m.name).sort()).toEqual(['hf.co/nerva-test/Shakespeare-GGUF:Q8_0', 'shakespeare:latest', 'shakespeare:q8', 'someone/bard:v1']);
    expect(listed.every((m) => m.path === blob && m.bytes === readFileSync(blob).byteLength)).toBe(true);
    // The DTYPE column: the file's general.file_type.
    expect(listed.map((m) => m.dtype)).toEqual(['Q8_0', 'Q8_0', 'Q8_0', 'Q8_0']);
  });

  it("a pull's params layer sets the sampling defaults and single-token stop strings; pulls that disagree set none", async () => {
    // A second model (other bytes, so no other manifest names its blob), pulled with params.
    const gguf = join(store, 'q4.gguf');
    await convertToGguf({ source: join(MODELS, 'tiny-shakespeare-qwen3'), out: gguf, type: 'Q4_0' });
    const bytes = readFileSync(gguf);
    const hex = createHash('sha256').update(bytes).digest('hex');
    copyFileSync(gguf, join(store, 'blobs', `sha256-${hex}`));
    const f = await GgufFile.open(gguf);
    const vocab = (f.get('tokenizer.ggml.tokens')!.value as unknown as { items: string[] }).items;
    await f.close();
    const blobOf = (text: string) => {
      const h = createHash('sha256').update(text).digest('hex');
      writeFileSync(join(store, 'blobs', `sha256-${h}`), text);
      return { mediaType: 'application/vnd.ollama.image.params', digest: `sha256:${h}`, size: text.length };
    };
    const model = { mediaType: 'application/vnd.ollama.image.model', digest: `sha256:${hex}`, size: bytes.byteLength };
    const params = blobOf(JSON.stringify({ temperature: 0.6, top_k: 20, top_p: 0.95, repeat_penalty: 1.1, num_ctx: 4096, stop: [vocab[5], 'not one token'] }));
    pulled('registry.ollama.ai', 'library', 'tuned', 'q4', [model, params]);
    const blobPath = await resolveModelDir('tuned:q4', { env: env() });
    expect(await ollamaParamsOf(blobPath)).toEqual({ generationConfig: { temperature: 0.6, top_k: 20, top_p: 0.95, repetition_penalty: 1.1 }, stop: [vocab[5], 'not one token'] });
    const m = await loadModelDir(blobPath);
    try {
      expect(m.generationConfig).toMatchObject({ temperature: 0.6, top_k: 20, top_p: 0.95, repetition_penalty: 1.1 });
      expect(m.stopTokenIds).toContain(5);
    } finally {
      await m.checkpoint.close();
    }
    // The same blob pulled again under another name with other params: which applies is unknown, so none does.
    pulled('registry.ollama.ai', 'library', 'tuned', 'other', [model, blobOf(JSON.stringify({ temperature: 1.2 }))]);
    expect(await ollamaParamsOf(blobPath)).toBeUndefined();
    // Params that are not JSON are no settings: the file's own defaults stand, nothing fails.
    rmSync(join(store, 'manifests', 'registry.ollama.ai', 'library', 'tuned', 'other'));
    const junk = blobOf('{not json');
    pulled('registry.ollama.ai', 'library', 'tuned', 'q4', [model, junk]);
    expect(await ollamaParamsOf(blobPath)).toBeUndefined();
    const plain = await loadModelDir(blobPath);
    expect(plain.generationConfig?.temperature).not.toBe(0.6);
    await plain.checkpoint.close();
    // A file outside an Ollama folder has no params.
    expect(await ollamaParamsOf(gguf)).toBeUndefined();
  });
});
