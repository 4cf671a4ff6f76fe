import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GgufFile } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FIXTURES, lastJson, nerva, nervaFails } from './cli-helpers.js';
import { startTestServer } from './helpers.js';

const tmp = mkdtempSync(join(tmpdir(), 'nerva-convert-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const SHAKESPEARE = join(FIXTURES, 'models', 'tiny-shakespeare-qwen3');
const gguf = join(tmp, 'shakespeare-f32.gguf');

beforeAll(async () => {
  await nerva(['convert', SHAKESPEARE, '--out', gguf, '--type', 'F32']);
});

describe('nerva convert', () => {
  it('writes a GGUF with llama.cpp metadata and reports what it wrote', async () => {
    const out = join(tmp, 'qwen2-bf16.gguf');
    const { stdout } = await nerva(['convert', join(FIXTURES, 'models', 'tiny-random-qwen2'), '--out', out, '--type', 'bf16', '--name', 'tiny qwen2']);
    const j = lastJson(stdout);
    expect(j).toMatchObject({ out, type: 'BF16', file_type: 32, tokenizer: false });
    const f = await GgufFile.open(out);
    try {
      expect(j.bytes).toBe(f.fileSize);
      expect(j.tensors).toBe(f.tensors.length);
      expect(f.get('general.name')).toEqual({ type: 'STRING', value: 'tiny qwen2' });
      expect(f.get('general.architecture')).toEqual({ type: 'STRING', value: 'qwen2' });
      expect(f.get('general.file_type')).toEqual({ type: 'UINT32', value: 32 });
      expect(f.tensor('blk.0.attn_q.bias').type).toBe('F32');
      expect(f.tensor('blk.0.attn_q.weight').type).toBe('BF16');
      expect(j.tensor_types).toEqual({ F32: f.tensors.filter((t) => t.type === 'F32').length, BF16: f.tensors.filter((t) => t.type === 'BF16').length });
    } finally {
      await f.close();
    }
  });

  it('a .gguf source is written again at --type; a quantized one only with --allow-requantize', async () => {
    const q8 = join(tmp, 'shakespeare-q8.gguf');
    const j = lastJson((await nerva(['convert', gguf, '--out', q8, '--type', 'Q8_0'])).stdout);
    expect(j).toMatchObject({ out: q8, type: 'Q8_0', file_type: 7, tokenizer: true });
    const q4 = join(tmp, 'shakespeare-q4km.gguf');
    const refused = await nervaFails(['convert', q8, '--out', q4, '--type', 'Q4_K_M']);
    expect(refused?.stderr).toMatch(/already quantized.*--allow-requantize/);
    expect(existsSync(q4)).toBe(false);
    const k = lastJson((await nerva(['convert', q8, '--out', q4, '--type', 'Q4_K_M', '--allow-requantize'])).stdout);
    expect(k.tensor_types).toMatchObject({ Q4_K: expect.any(Number), Q6_K: expect.any(Number) });
    // The file runs, its tokenizer and template carried over from the source's metadata.
    const run = lastJson((await nerva(['run', '--backend', 'cpu', '--model', q4, '--prompt', 'KING RICHARD III:', '--max-tokens', '4', '--temperature', '0', '--json'])).stdout);
    expect(run.token_ids).toHaveLength(4);
    expect(typeof run.text).toBe('string');
  });

  it('--split-max-size writes llama.cpp splits; --model takes the first and runs as the whole file does', async () => {
    const out = join(tmp, 'split.gguf');
    const j = lastJson((await nerva(['convert', SHAKESPEARE, '--out', out, '--type', 'F32', '--split-max-size', '2M'])).stdout);
    expect((j.files as string[]).length).toBeGreaterThan(2);
    expect(j.out).toBe(join(tmp, `split-00001-of-${String((j.files as string[]).length).padStart(5, '0')}.gguf`));
    const args = ['run', '--backend', 'cpu', '--prompt', 'KING RICHARD III:', '--max-tokens', '8', '--temperature', '0', '--json'];
    const a = lastJson((await nerva([...args, '--model', gguf])).stdout);
    const b = lastJson((await nerva([...args, '--model', j.out as string])).stdout);
    expect(b.token_ids).toEqual(a.token_ids);
    const bad = await nervaFails(['convert', SHAKESPEARE, '--out', join(tmp, 'bad.gguf'), '--split-max-size', 'lots']);
    expect(bad?.stderr).toMatch(/--split-max-size/);
    expect(existsSync(join(tmp, 'bad.gguf'))).toBe(false);
  });

  it('nerva run --model x.gguf generates what the safetensors folder generates', async () => {
    const args = ['run', '--backend', 'cpu', '--prompt', 'KING RICHARD III:', '--max-tokens', '16', '--temperature', '0', '--json'];
    const a = lastJson((await nerva([...args, '--model', SHAKESPEARE])).stdout);
    const b = lastJson((await nerva([...args, '--model', gguf])).stdout);
    expect(b.prompt_ids).toEqual(a.prompt_ids);
    expect(b.token_ids).toEqual(a.token_ids);
    expect(b.text).toBe(a.text);
    expect(b.model).toBe(gguf);
    const ta = lastJson((await nerva(['tokenize', '--model', SHAKESPEARE, '--text', 'To be, or not to be'])).stdout);
    const tb = lastJson((await nerva(['tokenize', '--model', gguf, '--text', 'To be, or not to be'])).stdout);
    expect(tb).toEqual(ta);
  });

  it('clear errors: missing folder, unknown type, existing output, unwritable output; nothing half-written', async () => {
    const dir = join(tmp, 'errs');
    mkdirSync(dir);
    const out = join(dir, 'x.gguf');
    const missing = await nervaFails(['convert', join(tmp, 'no-such-model'), '--out', out]);
    expect(missing?.stderr).toMatch(/no such model folder.*\[NOT_FOUND\]/);
    const notModel = await nervaFails(['convert', dir, '--out', out]);
    expect(notModel?.stderr).toMatch(/config\.json/);
    const badType = await nervaFails(['convert', SHAKESPEARE, '--out', out, '--type', 'Q3_K_XL']);
    expect(badType?.stderr).toMatch(/--type must be one of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, got "Q3_K_XL"/);
    const noDir = await nervaFails(['convert', SHAKESPEARE, '--out', join(dir, 'missing', 'x.gguf')]);
    expect(noDir?.stderr).toMatch(/cannot create a file in .*\[WRITE\]/);
    writeFileSync(out, 'precious');
    const exists = await nervaFails(['convert', SHAKESPEARE, '--out', out]);
    expect(exists?.stderr).toMatch(/already exists.*--force.*\[EXISTS\]/);
    expect(readdirSync(dir)).toEqual(['x.gguf']);
    await nerva(['convert', join(FIXTURES, 'models', 'tiny-random-qwen3'), '--out', out, '--force']);
    expect(readdirSync(dir)).toEqual(['x.gguf']);
    expect(existsSync(out)).toBe(true);
  });
});

describe('nerva serve --model x.gguf', () => {
  it('serves the GGUF: model name from the file, tokenizer and greedy completions as the folder', async () => {
    const a = await startTestServer({ model: SHAKESPEARE });
    const b = await startTestServer({ model: gguf });
    try {
      const models = (await (await fetch(`${b.url}/v1/models`)).json()) as { data: { id: string }[] };
      expect(models.data[0].id).toBe('shakespeare-f32');
      const body = { model: 'm', prompt: 'ROMEO:', max_tokens: 12, temperature: 0, ignore_eos: true };
      const ca = (await (await fetch(`${a.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, model: 'tiny-shakespeare-qwen3' }) })).json()) as { choices: { text: string }[] };
      const cb = (await (await fetch(`${b.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, model: 'shakespeare-f32' }) })).json()) as { choices: { text: string }[] };
      expect(cb.choices[0].text).toBe(ca.choices[0].text);
      expect(cb.choices[0].text.length).toBeGreaterThan(0);
      // The fixture has no chat template, so the fallback template applies to the GGUF as to the folder.
      const chat = await fetch(`${b.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'shakespeare-f32', messages: [{ role: 'user', content: 'Speak.' }], max_tokens: 4 }) });
      expect(chat.status).toBe(200);
      expect(b.state.notes.join(' ')).toMatch(/no chat template/);
    } finally {
      await a.shutdown();
      await b.shutdown();
    }
  });

  it('a .gguf path that does not exist is refused at startup', async () => {
    await expect(startTestServer({ model: join(tmp, 'absent.gguf') })).rejects.toThrow(/does not exist/);
  });
});
