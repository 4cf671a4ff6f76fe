import { join } from 'node:path';
import { NervaTokenizer } from '@nerva/models';
import { beforeAll, describe, expect, it } from 'vitest';
import { boundedStringPattern, CHAIN_LIMIT, expandBoundedStrings } from '../src/grammar/bounded-strings.js';
import { GrammarService, type GrammarSpec } from '../src/grammar/index.js';
import { schemaForXGrammar } from '../src/grammar/schema-rewrites.js';
import { DEFAULT_MODEL, FIXTURES } from './fixtures.js';

// Length-bounded JSON strings (minLength/maxLength) through the grammar engine: exactly the
// strings JSON Schema accepts, the length counted in code points of the decoded string (what ajv
// counts), escapes included, raw control characters refused.

const QWEN3 = join(FIXTURES, 'tokenizers', 'qwen3');
const QWEN3_EOS = [151645, 151643];

/** JSON Schema's length: code points of the decoded string. */
const length = (s: string) => [...s].length;

/** Every string written in the tests, as the JSON text of the string (escapes as written). */
const TEXTS: string[] = [
  '""',
  '"a"',
  '"ab"',
  '"abc"',
  '"abcd"',
  '"abcde"',
  '"abcdef"',
  // Non-ASCII: one code point each, of 2, 3 and 4 UTF-8 bytes.
  '"é"',
  '"éé"',
  '"中文"',
  '"中文字符"',
  '"中文字符和"',
  '"🎉"',
  '"🎉🚀"',
  '"🎉🚀🎉🚀"',
  '"🎉🚀🎉🚀🎉"',
  // Escapes: each one character.
  '"\\n"',
  '"a\\"b"',
  '"\\\\\\\\"',
  '"\\t\\t\\t\\t"',
  '"\\t\\t\\t\\t\\t"',
  '"\\u00e9\\u4e2d"',
  '"\\u00E9x\\u00e9"',
  '"\\ud83c\\udf89"',
  '"a\\uD83C\\uDF89b\\/"',
  '"\\ud83c\\udf89\\ud83c\\udf89\\ud83c\\udf89\\ud83c\\udf89\\ud83c\\udf89"',
];

/** Texts JSON forbids or JSON Schema's length does not count, whatever the bounds. */
const NEVER: string[] = [
  '"a\tb"', // a raw tab
  '"a\u0001"', // a raw control character
  '"a\nb"', // a raw newline
  '"a\\qb"', // no such escape
  '"\\u12"', // a short \u escape
  '"\\ud83c"', // a lone high surrogate
  '"\\udf89ab"', // a lone low surrogate
  '"ab\\ud83cx"', // a high surrogate not followed by a low one
];

describe('length-bounded JSON strings over Qwen3 (151,936 ids)', () => {
  let tok: NervaTokenizer;
  let svc: GrammarService;
  beforeAll(async () => {
    tok = await NervaTokenizer.fromDir(QWEN3);
    svc = new GrammarService(tok, 151936, QWEN3_EOS);
  });

  /** Whether the grammar takes `text` as the tokenizer encodes it, then a stop token. */
  const accepts = async (g: GrammarSpec, text: string): Promise<boolean> => {
    const st = (await svc.compile(g)).start(QWEN3_EOS);
    try {
      for (const t of tok.encode(text, { addSpecialTokens: false })) if (!st.advance(t)) return false;
      return st.advance(QWEN3_EOS[0]) && st.terminated;
    } finally {
      st.dispose();
    }
  };

  const schema = (s: object): GrammarSpec => ({ type: 'json_schema', schema: JSON.stringify(s) });

  it.each([
    { min: undefined, max: 4 },
    { min: 2, max: 4 },
    { min: 3, max: 3 },
    { min: 0, max: 0 },
    { min: 1, max: undefined },
    { min: 4, max: undefined },
  ])('minLength $min, maxLength $max: each string accepted iff its code points are in bounds (at the root, in an object, in an array)', async ({ min, max }) => {
    const s = { type: 'string', ...(min !== undefined && { minLength: min }), ...(max !== undefined && { maxLength: max }) };
    const inBounds = (text: string) => {
      const n = length(JSON.parse(text) as string);
      return n >= (min ?? 0) && n <= (max ?? Infinity);
    };
    // Both sides of each bound are among the texts.
    const lengths = new Set(TEXTS.map((t) => length(JSON.parse(t) as string)));
    for (const b of [min, max]) if (b !== undefined) for (const n of [b - 1, b, b + 1].filter((x) => x >= 0)) expect(lengths.has(n), `a text of length ${n}`).toBe(true);
    const root = schema(s);
    const inObject = schema({ type: 'object', properties: { k: s, n: { type: 'integer' } }, required: ['k'], additionalProperties: false });
    const inArray = schema({ type: 'array', items: s });
    for (const text of TEXTS) {
      const want = inBounds(text);
      expect(await accepts(root, text), `${text} at the root`).toBe(want);
      expect(await accepts(inObject, `{"k": ${text}}`), `${text} in an object`).toBe(want);
      expect(await accepts(inObject, `{"k": ${text}, "n": 7}`), `${text} in an object, then a property`).toBe(want);
      expect(await accepts(inArray, `[${text}, ${text}]`), `${text} in an array`).toBe(want);
    }
    for (const text of NEVER) {
      expect(await accepts(root, text), `${JSON.stringify(text)} at the root`).toBe(false);
      expect(await accepts(inArray, `[${text}]`), `${JSON.stringify(text)} in an array`).toBe(false);
    }
  });

  it('the closing quote may come inside a token that runs on into the JSON (`",`, `"}`, `"]`), and not into anything else', async () => {
    const g = schema({ type: 'object', properties: { a: { type: 'string', maxLength: 3 }, b: { type: 'array', items: { type: 'string', maxLength: 2 } } }, required: ['a', 'b'], additionalProperties: false });
    const text = '{"a": "xyz", "b": ["p", "qr"]}';
    const ids = tok.encode(text, { addSpecialTokens: false });
    // The tokenizer does merge a closing quote with what follows (else this test checks nothing).
    expect(ids.map((t) => tok.decode([t])).some((p) => /^[^"]*"[,\]}]/.test(p))).toBe(true);
    expect(await accepts(g, text)).toBe(true);
    const st = (await svc.compile(g)).start(QWEN3_EOS);
    for (const t of tok.encode('{"a": "xy', { addSpecialTokens: false })) expect(st.advance(t)).toBe(true);
    // A quote then a letter is no JSON; a quote then a comma is.
    for (const [piece, ok] of [
      ['"a', false],
      ['")', false],
      ['",', true],
    ] as const) {
      const ids2 = tok.encode(piece, { addSpecialTokens: false });
      expect(ids2, piece).toHaveLength(1);
      expect(st.allows(ids2[0]), piece).toBe(ok);
    }
    st.dispose();
  });

  it('a schema with a pattern or a format keeps XGrammar own spelling (only minLength/maxLength alone are rewritten)', async () => {
    expect(await accepts(schema({ type: 'string', pattern: '^[a-z]{2,3}$', maxLength: 3 }), '"abc"')).toBe(true);
    expect(await accepts(schema({ type: 'string', pattern: '^[a-z]{2,3}$', maxLength: 3 }), '"a"')).toBe(false);
  });

  it('inside a structural tag (text follows the JSON): a bounded string at the root still ends where the tag does', async () => {
    const tag = { type: 'tag', begin: '<v>', content: { type: 'json_schema', json_schema: { type: 'string', minLength: 1, maxLength: 3 } }, end: '</v>' };
    const g: GrammarSpec = { type: 'structural_tag', format: tag };
    expect(await accepts(g, '<v>"ab"</v>')).toBe(true);
    expect(await accepts(g, '<v>"abc"</v>')).toBe(true);
    expect(await accepts(g, '<v>"abcd"</v>')).toBe(false);
    expect(await accepts(g, '<v>""</v>')).toBe(false);
    expect(await accepts(g, '<v>"a\tb"</v>')).toBe(false);
    // Inside an object in a tag, the string's end may run on into the JSON's punctuation.
    const obj = { ...tag, content: { type: 'json_schema', json_schema: { type: 'object', properties: { a: { type: 'string', maxLength: 2 } }, required: ['a'] } } };
    expect(await accepts({ type: 'structural_tag', format: obj }, '<v>{"a": "ab"}</v>')).toBe(true);
    expect(await accepts({ type: 'structural_tag', format: obj }, '<v>{"a": "abc"}</v>')).toBe(false);
  });
});

describe('the EBNF of bounded strings', () => {
  it('a sentinel the converter spelled otherwise is an error, not a grammar of the sentinel text', () => {
    expect(() => expandBoundedStrings('root ::= "\\"" "\\ue000" "n" "e" "r" "v" "a" "-" "x" "\\ue000" "\\""')).toThrow(/not expanded/);
    // A grammar without bounded strings is left as it is.
    expect(expandBoundedStrings('root ::= "a"\n')).toBe('root ::= "a"\n');
  });

  it('strings inside an object or array are marked as followed by JSON punctuation; at the root or in $defs they are not', () => {
    const str = { type: 'string', maxLength: 3 };
    const out = schemaForXGrammar({
      type: 'object',
      properties: { a: str, b: { type: 'array', items: str }, c: { anyOf: [str, { type: 'null' }] } },
      $defs: { d: str },
      anyOf: [str],
    }) as Record<string, any>;
    const inside = boundedStringPattern(0, 3, true);
    const open = boundedStringPattern(0, 3, false);
    expect(out.properties.a.pattern).toBe(inside);
    expect(out.properties.b.items.pattern).toBe(inside);
    expect(out.properties.c.anyOf[0].pattern).toBe(inside);
    expect(out.$defs.d.pattern).toBe(open);
    expect(out.anyOf[0].pattern).toBe(open);
    expect((schemaForXGrammar(str) as Record<string, unknown>).pattern).toBe(open);
  });

  it('over the embedded model (4,096 ids), random walks stay in bounds', async () => {
    const tok = await NervaTokenizer.fromDir(DEFAULT_MODEL);
    const svc = new GrammarService(tok, 4096, [0]);
    const g = await svc.compile({ type: 'json_schema', schema: JSON.stringify({ type: 'array', items: { type: 'string', minLength: 2, maxLength: 5 }, minItems: 3, maxItems: 3 }) });
    let s = 12345;
    const rand = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0), s / 2 ** 32);
    for (let walk = 0; walk < 8; walk++) {
      const st = g.start([0]);
      const out: number[] = [];
      for (let step = 0; step < 200 && !st.terminated; step++) {
        const ids: number[] = [];
        for (let t = 0; t < 4096; t++) if (st.allows(t) && !tok.decode([t]).includes('\uFFFD')) ids.push(t);
        const t = ids.includes(0) ? 0 : ids[Math.floor(rand() * ids.length)];
        expect(st.advance(t)).toBe(true);
        if (t !== 0) out.push(t);
      }
      expect(st.terminated).toBe(true);
      const v = JSON.parse(tok.decode(out)) as string[];
      expect(v).toHaveLength(3);
      for (const x of v) expect(length(x)).toBeGreaterThanOrEqual(2);
      for (const x of v) expect(length(x)).toBeLessThanOrEqual(5);
      st.dispose();
    }
  });

  it(`past ${CHAIN_LIMIT} characters, XGrammar's repetition of unescaped characters: the bounds exact, control characters refused`, async () => {
    const tok = await NervaTokenizer.fromDir(DEFAULT_MODEL);
    const svc = new GrammarService(tok, 4096, [0]);
    const n = CHAIN_LIMIT + 4;
    const g = await svc.compile({ type: 'json_schema', schema: JSON.stringify({ type: 'string', minLength: n - 1, maxLength: n }) });
    const accepts = (text: string): boolean => {
      const st = g.start([0]);
      try {
        for (const t of tok.encode(text, { addSpecialTokens: false })) if (!st.advance(t)) return false;
        return st.advance(0) && st.terminated;
      } finally {
        st.dispose();
      }
    };
    for (const len of [n - 2, n - 1, n, n + 1]) expect(accepts(`"${'ab'.repeat(len).slice(0, len)}"`), `length ${len}`).toBe(len >= n - 1 && len <= n);
    expect(accepts(`"${'a'.repeat(n - 2)}\t"`)).toBe(false);
  });
});
