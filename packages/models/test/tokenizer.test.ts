import { cp, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { NervaTokenizer, TokenizerError, type ChatMessage } from '../src/index.js';
import { MODELS, QWEN3_TOKENIZER, tempDir } from './helpers.js';

interface Reference {
  encode: { text: string; ids: number[]; decoded: string }[];
  chat: { messages: ChatMessage[]; kwargs: Record<string, unknown>; rendered: string; ids: number[] }[];
}

let tok: NervaTokenizer;
let ref: Reference;

beforeAll(async () => {
  tok = await NervaTokenizer.fromDir(QWEN3_TOKENIZER);
  ref = JSON.parse(await readFile(join(QWEN3_TOKENIZER, 'reference.json'), 'utf8'));
});

describe('NervaTokenizer against the Hugging Face Qwen3 reference', () => {
  it('encodes every reference string to the reference ids and decodes back', () => {
    expect(ref.encode.length).toBeGreaterThanOrEqual(10);
    for (const c of ref.encode) {
      expect(tok.encode(c.text, { addSpecialTokens: false }), JSON.stringify(c.text)).toEqual(c.ids);
      expect(tok.decode(c.ids)).toBe(c.decoded);
    }
  });

  it('renders every chat case exactly, with kwargs passed through, and its ids match', () => {
    expect(ref.chat.length).toBeGreaterThan(0);
    for (const c of ref.chat) {
      const { enable_thinking, ...extra } = c.kwargs as { enable_thinking?: boolean };
      const rendered = tok.applyChatTemplate(c.messages, { addGenerationPrompt: true, enableThinking: enable_thinking, extra });
      expect(rendered).toBe(c.rendered);
      expect(tok.encode(rendered, { addSpecialTokens: false })).toEqual(c.ids);
      expect(tok.encodeChat(c.messages, { enableThinking: enable_thinking, extra })).toEqual(c.ids);
    }
  });

  it('enable_thinking=false adds the empty think block; undefined does not', () => {
    const msgs = [{ role: 'user', content: 'hi' }];
    expect(tok.applyChatTemplate(msgs, { enableThinking: false })).toMatch(/<think>\n\n<\/think>\n\n$/);
    expect(tok.applyChatTemplate(msgs)).toMatch(/<\|im_start\|>assistant\n$/);
    expect(tok.applyChatTemplate(msgs, { addGenerationPrompt: false })).toBe('<|im_start|>user\nhi<|im_end|>\n');
  });

  it('passes tools to the template', () => {
    const tools = [{ type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }];
    const s = tok.applyChatTemplate([{ role: 'user', content: 'time?' }], { tools });
    expect(s).toContain('<tools>');
    expect(s).toContain('"name": "get_time"');
  });

  it('special tokens, eos, vocabulary size and token strings', () => {
    const imEnd = tok.tokenToId('<|im_end|>')!;
    expect(imEnd).toBe(151645);
    expect(tok.eosTokenIds).toEqual([151645]);
    expect(tok.isSpecial(imEnd)).toBe(true);
    expect(tok.isSpecial(9707)).toBe(false);
    expect(tok.tokenToString(9707)).toBe('Hello');
    expect(tok.vocabSize).toBeGreaterThan(151645);
    expect(tok.decode([151644, 872, 198, 6023, 151645], { skipSpecialTokens: true })).toBe('user\nhi');
    expect(tok.decode([])).toBe('');
  });

  it('rejects ids outside the vocabulary', () => {
    expect(() => tok.decode([1, tok.vocabSize])).toThrow(TokenizerError);
    expect(() => tok.decode([-1])).toThrow(/not in the vocabulary/);
    expect(() => tok.decode([1.5])).toThrow(TokenizerError);
  });
});

describe('NervaTokenizer loading and template errors', () => {
  it('tiny-shakespeare tokenizer: no chat template → NO_CHAT_TEMPLATE', async () => {
    const t = await NervaTokenizer.fromDir(join(MODELS, 'tiny-shakespeare-qwen3'));
    expect(t.eosTokenIds).toEqual([0]);
    expect(t.decode(t.encode('To be, or not to be'))).toBe('To be, or not to be');
    expect(() => t.applyChatTemplate([{ role: 'user', content: 'x' }])).toThrow(expect.objectContaining({ code: 'NO_CHAT_TEMPLATE' }));
  });

  it('missing or malformed files → NOT_FOUND / MALFORMED naming the file', async () => {
    const dir = await tempDir();
    await expect(NervaTokenizer.fromDir(dir)).rejects.toMatchObject({ code: 'NOT_FOUND', message: expect.stringContaining('tokenizer.json') });
    await writeFile(join(dir, 'tokenizer.json'), '{"model": ');
    await expect(NervaTokenizer.fromDir(dir)).rejects.toMatchObject({ code: 'MALFORMED' });
    await writeFile(join(dir, 'tokenizer.json'), '{"version": "1.0"}');
    await expect(NervaTokenizer.fromDir(dir)).rejects.toMatchObject({ code: 'MALFORMED', message: expect.stringContaining('model') });
    await cp(join(MODELS, 'tiny-shakespeare-qwen3', 'tokenizer.json'), join(dir, 'tokenizer.json'));
    await writeFile(join(dir, 'tokenizer_config.json'), '[');
    await expect(NervaTokenizer.fromDir(dir)).rejects.toMatchObject({ code: 'MALFORMED', message: expect.stringContaining('tokenizer_config.json') });
    await rm(join(dir, 'tokenizer_config.json'));
    expect((await NervaTokenizer.fromDir(dir)).vocabSize).toBe(4096);
  });

  it('chat_template.jinja, bos/eos variables and raise_exception', async () => {
    const dir = await tempDir();
    await cp(join(MODELS, 'tiny-shakespeare-qwen3', 'tokenizer.json'), join(dir, 'tokenizer.json'));
    await writeFile(join(dir, 'tokenizer_config.json'), JSON.stringify({ bos_token: { content: '<s>' }, eos_token: '<|endoftext|>' }));
    await writeFile(
      join(dir, 'chat_template.jinja'),
      "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools: ' + m.role) }}{% endif %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}{{ greeting }}",
    );
    const t = await NervaTokenizer.fromDir(dir);
    expect(t.applyChatTemplate([{ role: 'user', content: 'a' }], { extra: { greeting: '!' } })).toBe('<s>[user]a<|endoftext|>!');
    expect(() => t.applyChatTemplate([{ role: 'tool', content: 'x' }])).toThrow(expect.objectContaining({ code: 'TEMPLATE_ERROR', message: expect.stringContaining('no tools: tool') }));
  });
});
