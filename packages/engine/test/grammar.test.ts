import { join } from 'node:path';
import { NervaTokenizer } from '@nerva/models';
import { beforeAll, describe, expect, it } from 'vitest';
import { checkGrammar, encodeVocab, GrammarService, type GrammarSpec, type GrammarState } from '../src/grammar/index.js';
import { alignedRanges } from '../src/grammar/schema-rewrites.js';
import { InvalidParamsError } from '../src/sampling-params.js';
import { DEFAULT_MODEL, FIXTURES } from './fixtures.js';

// Constrained decoding's grammar engine (XGrammar as WebAssembly) against our tokenizers: Qwen3's
// 151,936-id vocabulary and the embedded model's 4,096.

const QWEN3 = join(FIXTURES, 'tokenizers', 'qwen3');
const QWEN3_VOCAB = 151936;
const QWEN3_EOS = [151645, 151643];

/** A deterministic generator (tests draw "model" tokens from it). */
function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

function allowedIds(st: GrammarState, size: number): number[] {
  const out: number[] = [];
  for (let t = 0; t < size; t++) if (st.allows(t)) out.push(t);
  return out;
}

/** Feed `ids` and then a stop token; every one must be allowed when it comes, and the grammar must end. */
function feed(st: GrammarState, ids: number[], stop: number): void {
  for (const t of ids) {
    expect(st.allows(t)).toBe(true);
    expect(st.advance(t)).toBe(true);
  }
  expect(st.allows(stop)).toBe(true);
  expect(st.advance(stop)).toBe(true);
  expect(st.terminated).toBe(true);
}

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 6 },
    n: { type: 'integer', minimum: 0, maximum: 99 },
    tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 3 },
    ok: { type: 'boolean' },
    x: { type: 'number' },
  },
  required: ['name', 'n', 'ok'],
  additionalProperties: false,
};

function checkSchemaValue(v: unknown): void {
  const o = v as Record<string, unknown>;
  expect(Object.keys(o).every((k) => k in SCHEMA.properties)).toBe(true);
  expect(typeof o.name).toBe('string');
  expect([...(o.name as string)].length, JSON.stringify(o.name)).toBeLessThanOrEqual(6);
  expect(Number.isInteger(o.n) && (o.n as number) >= 0 && (o.n as number) <= 99).toBe(true);
  expect(typeof o.ok).toBe('boolean');
  if ('tags' in o) expect((o.tags as string[]).every((t) => t === 'a' || t === 'b') && (o.tags as string[]).length <= 3).toBe(true);
  if ('x' in o) expect(typeof o.x).toBe('number');
}

describe.each([
  { name: 'Qwen3 (151,936 ids)', dir: QWEN3, size: QWEN3_VOCAB, eos: QWEN3_EOS },
  { name: 'the embedded model (4,096 ids)', dir: DEFAULT_MODEL, size: 4096, eos: [0] },
])('XGrammar over $name', ({ dir, size, eos }) => {
  let tok: NervaTokenizer;
  let svc: GrammarService;
  beforeAll(async () => {
    tok = await NervaTokenizer.fromDir(dir);
    svc = new GrammarService(tok, size, eos);
  });

  it('reads the vocabulary as byte-level BPE, special tokens and padded ids never text', () => {
    const v = encodeVocab(tok, size);
    expect(v.type).toBe('byte_level');
    expect(v.tokens).toHaveLength(size);
    for (let id = 0; id < size; id++) if (!tok.hasId(id) || tok.isSpecial(id)) expect(v.tokens[id]).toBe('');
  });

  it('accepts exactly the token ids our tokenizer gives any text (multi-byte characters, spaces, newlines)', async () => {
    for (const text of ['Hello, world!', '  two  spaces\nand a newline\ttab', 'naïve café — “quotes”', '中文字符和emoji 🎉🚀', '{"k": [1, 2.5e-3, null]}']) {
      const ids = tok.encode(text, { addSpecialTokens: false });
      expect(tok.decode(ids)).toBe(text);
      const g = await svc.compile({ type: 'choice', choices: [text] });
      feed(g.start(eos), ids, eos[0]);
    }
  });

  it('JSON Schema: random walks over the allowed tokens decode to JSON that validates; special tokens never allowed', async () => {
    const g = await svc.compile({ type: 'json_schema', schema: JSON.stringify(SCHEMA), strict: true });
    const rand = lcg(7);
    for (let walk = 0; walk < 6; walk++) {
      const st = g.start(eos);
      const out: number[] = [];
      for (let step = 0; step < 400 && !st.terminated; step++) {
        const ids = allowedIds(st, size);
        expect(ids.length).toBeGreaterThan(0);
        for (let id = 0; id < size; id++) if (tok.isSpecial(id) && !eos.includes(id)) expect(st.allows(id)).toBe(false);
        // Stop as soon as the grammar allows it (a model would, eventually); otherwise any allowed
        // token of whole characters. (Byte tokens can spell ill-formed UTF-8 inside a string, e.g.
        // an overlong sequence, which XGrammar's byte matching lets through and a decoder turns
        // into U+FFFD: still JSON, but a length bound then counts differently.)
        const stop = ids.find((t) => eos.includes(t));
        const whole = ids.filter((t) => !tok.decode([t]).includes('\uFFFD'));
        const t = stop ?? whole[Math.floor(rand() * whole.length)];
        expect(st.advance(t)).toBe(true);
        if (stop === undefined) out.push(t);
      }
      expect(st.terminated).toBe(true);
      const text = tok.decode(out);
      checkSchemaValue(JSON.parse(text));
      // No free whitespace: outside strings, a space only after a separator (Python's json.dumps).
      const bare = text.replace(/"(?:[^"\\]|\\.)*"/g, '""');
      expect(bare.replace(/[,:] /g, '')).not.toMatch(/\s/);
    }
  });

  it('refuses a token the grammar does not allow, changing nothing', async () => {
    const g = await svc.compile({ type: 'regex', pattern: '[0-9]{2}' });
    const st = g.start(eos);
    const letter = tok.encode('x', { addSpecialTokens: false })[0];
    expect(st.allows(letter)).toBe(false);
    expect(st.advance(letter)).toBe(false);
    expect(st.allows(eos[0])).toBe(false);
    feed(st, tok.encode('42', { addSpecialTokens: false }), eos[0]);
  });
});

describe('grammar kinds and bad grammars', () => {
  let svc: GrammarService;
  let tok: NervaTokenizer;
  beforeAll(async () => {
    tok = await NervaTokenizer.fromDir(DEFAULT_MODEL);
    svc = new GrammarService(tok, 4096, [0]);
  });

  const accepts = async (g: GrammarSpec, text: string): Promise<boolean> => {
    const st = (await svc.compile(g)).start([0]);
    for (const t of tok.encode(text, { addSpecialTokens: false })) if (!st.advance(t)) return false;
    return st.advance(0) && st.terminated;
  };

  it('json_object, regex, choice, EBNF (GBNF syntax) and structural tags constrain as they say', async () => {
    expect(await accepts({ type: 'json_object' }, '{"a": [1, {"b": null}]}')).toBe(true);
    expect(await accepts({ type: 'json_object' }, '[1, 2]')).toBe(false);
    expect(await accepts({ type: 'regex', pattern: '(ab)+c?' }, 'ababc')).toBe(true);
    expect(await accepts({ type: 'regex', pattern: '(ab)+c?' }, 'abca')).toBe(false);
    expect(await accepts({ type: 'choice', choices: ['yes', 'no'] }, 'no')).toBe(true);
    expect(await accepts({ type: 'choice', choices: ['yes', 'no'] }, 'n')).toBe(false);
    const gbnf = 'root ::= item ("," item)*  # a list\nitem ::= [a-z]+ | [0-9]{1,2}';
    expect(await accepts({ type: 'grammar', grammar: gbnf }, 'ab,7,xyz')).toBe(true);
    expect(await accepts({ type: 'grammar', grammar: gbnf }, 'ab,,7')).toBe(false);
    const tag = { type: 'tag', begin: '<call>', content: { type: 'json_schema', json_schema: { type: 'object', properties: { x: { type: 'integer' } }, required: ['x'] } }, end: '</call>' };
    const st = { type: 'tags_with_separator', tags: [tag], separator: '\n', at_least_one: true, stop_after_first: false };
    expect(await accepts({ type: 'structural_tag', format: st }, '<call>{"x": 1}</call>\n<call>{"x": 22}</call>')).toBe(true);
    expect(await accepts({ type: 'structural_tag', format: st }, '')).toBe(false);
    // JSON inside tags is compact too: no free whitespace a model could pad with.
    expect(await accepts({ type: 'structural_tag', format: st }, '<call>{ "x" : 1}</call>')).toBe(false);
    expect(await accepts({ type: 'structural_tag', format: st }, '<call>{"x":1}</call>')).toBe(false);
  });

  it('integer bounds are exact (XGrammar 0.1.27 alone gets [1500, 1700], [0, 130] and [1500, 1699] wrong; the schema is rewritten)', async () => {
    expect(alignedRanges(1500, 1700)).toEqual([
      [1500, 1599],
      [1600, 1699],
      [1700, 1700],
    ]);
    // Few pieces for a wide range: at most 9 a digit and sign.
    expect(alignedRanges(-999_999, 999_999).length).toBeLessThanOrEqual(2 * 9 * 6 + 1);
    for (const [lo, hi] of [
      [1500, 1700],
      [1500, 1699],
      [0, 130],
      [-37, 124],
      [7, 7],
    ]) {
      const g: GrammarSpec = { type: 'json_schema', schema: JSON.stringify({ type: 'integer', minimum: lo, maximum: hi }) };
      for (let v = lo - 40; v <= hi + 40; v++) expect(await accepts(g, String(v)), `${v} in [${lo}, ${hi}]`).toBe(v >= lo && v <= hi);
    }
    // Strings: a tab is no character of a JSON string (written raw), bounded or not.
    expect(await accepts({ type: 'json_schema', schema: '{"type": "string", "maxLength": 4}' }, '"a\tb"')).toBe(false);
    expect(await accepts({ type: 'json_schema', schema: '{"type": "string", "maxLength": 4}' }, '"ab c"')).toBe(true);
  });

  it('a bad grammar is an InvalidParamsError with XGrammar message; dozens of them leave the engine working', async () => {
    const bad: [GrammarSpec, RegExp][] = [
      [{ type: 'grammar', grammar: 'root ::= foo' }, /Rule "foo" is not defined/],
      [{ type: 'grammar', grammar: 'root ::= "a" | ' }, /EBNF parser error/],
      [{ type: 'json_schema', schema: '{"type": "frob"}' }, /Unsupported type "frob"/],
      [{ type: 'regex', pattern: '(unclosed' }, /./],
    ];
    for (const [g, msg] of bad) {
      const err = await svc.compile(g, 'response_format').catch((e: unknown) => e);
      expect(err).toBeInstanceOf(InvalidParamsError);
      expect((err as InvalidParamsError).param).toBe('response_format');
      expect((err as Error).message).toMatch(msg);
    }
    // Each abort kills the checking instance only; a new one is built for the next grammar.
    for (let i = 0; i < 60; i++) await expect(checkGrammar({ type: 'grammar', grammar: `root ::= r${i}` })).rejects.toBeInstanceOf(InvalidParamsError);
    expect(await accepts({ type: 'choice', choices: ['still works'] }, 'still works')).toBe(true);
  });
});
