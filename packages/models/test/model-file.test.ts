import { cp, mkdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { createDetokenizer, loadModelConfig, loadModelDir, ModelFileError, NervaTokenizer, parseModelConfig, readModelText } from '../src/index.js';
import { MODELS, tempDir } from './helpers.js';

/** A hostile model folder: symlinks out of it, oversized files and absurd dimensions are refused. */

const TINY = join(MODELS, 'tiny-shakespeare-qwen3');

async function copyOfTiny(): Promise<string> {
  const d = await tempDir();
  const m = join(d, 'model');
  await cp(TINY, m, { recursive: true });
  return m;
}

async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
    return undefined;
  } catch (e) {
    return (e as { code?: string }).code;
  }
}

describe('model-folder files are confined to the folder', () => {
  it('a chat_template.jinja symlinked to a file outside is refused, not read and echoed back', async () => {
    const m = await copyOfTiny();
    const secret = join(m, '..', 'secret.txt');
    await writeFile(secret, 'TOP SECRET');
    await symlink(secret, join(m, 'chat_template.jinja'));
    expect(await codeOf(NervaTokenizer.fromDir(m))).toBe('OUTSIDE_MODEL_DIR');
  });

  it('config.json, tokenizer.json and a weight file symlinked outside are refused', async () => {
    for (const name of ['config.json', 'tokenizer.json', 'model.safetensors']) {
      const m = await copyOfTiny();
      const outside = join(m, '..', `outside-${name}`);
      await cp(join(m, name), outside);
      await rm(join(m, name));
      await symlink(outside, join(m, name));
      expect(await codeOf(loadModelDir(m)), name).toBe('OUTSIDE_MODEL_DIR');
    }
  });

  it('a symlink that stays inside the folder is fine, and so is a Hugging Face cache snapshot (links into blobs/)', async () => {
    const m = await copyOfTiny();
    await mkdir(join(m, 'sub'));
    await cp(join(m, 'config.json'), join(m, 'sub', 'real-config.json'));
    await rm(join(m, 'config.json'));
    await symlink(join('sub', 'real-config.json'), join(m, 'config.json'));
    expect((await loadModelConfig(m)).vocabSize).toBe(4096);

    const repo = join(await tempDir(), 'models--org--tiny');
    const snap = join(repo, 'snapshots', 'abc123');
    await mkdir(join(repo, 'blobs'), { recursive: true });
    await mkdir(snap, { recursive: true });
    for (const name of ['config.json', 'tokenizer.json', 'tokenizer_config.json', 'model.safetensors']) {
      await cp(join(TINY, name), join(repo, 'blobs', `blob-${name}`));
      await symlink(join('..', '..', 'blobs', `blob-${name}`), join(snap, name));
    }
    const loaded = await loadModelDir(snap);
    expect(loaded.spec.vocabSize).toBe(4096);
    await loaded.checkpoint.close();
  });
});

describe('size caps and sanity bounds', () => {
  it('an oversized config.json is refused before it is parsed', async () => {
    const m = await copyOfTiny();
    const cfg = JSON.parse(await readFile(join(m, 'config.json'), 'utf8')) as Record<string, unknown>;
    await writeFile(join(m, 'config.json'), JSON.stringify({ ...cfg, padding: 'x'.repeat(5 << 20) }));
    expect(await codeOf(loadModelConfig(m))).toBe('TOO_LARGE');
    expect(await codeOf(readModelText(m, 'tokenizer.json', 1024))).toBe('TOO_LARGE');
  });

  it('absurd dimensions are refused', async () => {
    const cfg = JSON.parse(await readFile(join(TINY, 'config.json'), 'utf8')) as Record<string, unknown>;
    for (const [k, v] of [['vocab_size', 2 ** 40], ['hidden_size', 2 ** 30], ['num_hidden_layers', 1e6], ['max_position_embeddings', 2 ** 50]] as const) {
      expect(() => parseModelConfig({ ...cfg, [k]: v }, 'config.json'), k).toThrow(/beyond any real model/);
    }
    expect(parseModelConfig(cfg, 'config.json').vocabSize).toBe(4096);
  });

  it('readModelText refuses a directory and a missing file with typed errors', async () => {
    const m = await copyOfTiny();
    await mkdir(join(m, 'dir.json'));
    await expect(readModelText(m, 'dir.json')).rejects.toBeInstanceOf(ModelFileError);
    expect(await codeOf(readModelText(m, 'nope.json'))).toBe('NOT_FOUND');
  });
});

describe('the detokenizer and ids without a token', () => {
  it('an id past the tokenizer (a padded checkpoint row) has no text and does not throw', async () => {
    const tok = await NervaTokenizer.fromDir(TINY);
    const d = createDetokenizer(tok);
    const hello = tok.encode('KING: hello', { addSpecialTokens: false });
    let text = '';
    for (const id of [hello[0], tok.vocabSize + 5, ...hello.slice(1), 151_900]) text += d.push(id);
    text += d.flush();
    expect(text).toBe(tok.decode(hello));
    expect(tok.hasId(tok.vocabSize)).toBe(false);
  });
});
