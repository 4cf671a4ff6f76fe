import { once } from 'node:events';
import { join } from 'node:path';
import type { Worker } from 'node:worker_threads';
import { NervaTokenizer } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeVocab, GrammarEngineError, GrammarPool, GrammarService, grammarWorkerUrl, type GrammarSpec, type GrammarState } from '../src/grammar/index.js';
import { InvalidParamsError } from '../src/sampling-params.js';
import { FIXTURES } from './fixtures.js';

// Grammar matchers on worker threads (GrammarPool) against the same matchers on this thread
// (GrammarService): the same masks at every step, driven as the step loop drives them (every
// row's token submitted, one flush, then every row waited for), on Qwen3's 151,936-id vocabulary.
// Needs the built worker entry (dist/grammar-worker.js): the package's tests run after its build.

const QWEN3 = join(FIXTURES, 'tokenizers', 'qwen3');
const VOCAB = 151936;
const EOS = [151645, 151643];

/** Bounded fields the grammar walks through, then free text (where nearly every token is allowed). */
const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 8 },
    n: { type: 'integer', minimum: 0, maximum: 99 },
    tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 3 },
    ok: { type: 'boolean' },
    x: { type: 'number' },
    notes: { type: 'string' },
  },
  required: ['name', 'n', 'ok', 'notes'],
  additionalProperties: false,
};
const JSON_SCHEMA: GrammarSpec = { type: 'json_schema', schema: JSON.stringify(SCHEMA), strict: true };

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

function allowed(st: GrammarState): number[] {
  const out: number[] = [];
  for (let t = 0; t < VOCAB; t++) if (st.allows(t)) out.push(t);
  return out;
}

/** Where the two masks differ first (-1: nowhere). */
function firstDiff(a: Int32Array, b: Int32Array): number {
  if (a.length !== b.length) return 0;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

describe('grammar worker pool', () => {
  let tok: NervaTokenizer;
  let local: GrammarService;
  /** Ids whose text is whole characters (byte tokens can spell ill-formed UTF-8, see grammar.test.ts). */
  let whole: Uint8Array;
  const pools: GrammarPool[] = [];
  const pool = (threads: number) => {
    const entry = grammarWorkerUrl();
    if (!entry) throw new Error('dist/grammar-worker.js is not built: build @nerva/engine before its tests');
    const p = new GrammarPool(entry, threads, () => encodeVocab(tok, VOCAB), VOCAB, EOS);
    pools.push(p);
    return p;
  };
  beforeAll(async () => {
    tok = await NervaTokenizer.fromDir(QWEN3);
    local = new GrammarService(tok, VOCAB, EOS);
    whole = new Uint8Array(VOCAB);
    for (let t = 0; t < tok.vocabSize; t++) whole[t] = tok.decode([t]).includes('\uFFFD') ? 0 : 1;
  });
  afterAll(() => {
    for (const p of pools) p.dispose();
    local?.dispose();
  });

  it('gives the masks of the in-thread matcher at every step, rows spread over 3 workers (JSON Schema, hundreds of steps)', async () => {
    const p = pool(3);
    const rows = 6;
    const pooled = await p.start(JSON_SCHEMA, Array.from({ length: rows }, () => EOS));
    const compiled = await local.compile(JSON_SCHEMA);
    const mine = Array.from({ length: rows }, () => compiled.start(EOS));
    const rands = Array.from({ length: rows }, (_, r) => lcg(100 + r));
    let steps = 0;
    let compared = 0;
    for (let step = 0; step < 120; step++) {
      const live = [...Array(rows).keys()].filter((r) => !mine[r].terminated);
      if (live.length === 0) break;
      // The step loop's order: every row waits for its mask, then samples; then every row submits.
      for (const r of live) pooled[r].ready();
      const tokens = live.map((r) => {
        expect(firstDiff(pooled[r].mask, mine[r].mask), `row ${r} step ${step}`).toBe(-1);
        compared++;
        const ids = allowed(mine[r]);
        expect(ids.length).toBeGreaterThan(0);
        // Past 40 tokens (or where nothing else is allowed), stop where the grammar allows it; else
        // any allowed token of whole characters.
        const stop = ids.find((t) => EOS.includes(t));
        const text = ids.filter((t) => !EOS.includes(t) && whole[t] === 1);
        return (step > 40 || text.length === 0) && stop !== undefined ? stop : text[Math.floor(rands[r]() * text.length)];
      });
      live.forEach((r, k) => {
        expect(pooled[r].submit(tokens[k])).toBe(true);
        expect(mine[r].advance(tokens[k])).toBe(true);
      });
      p.flush();
      for (const r of live) {
        pooled[r].ready();
        expect(pooled[r].terminated).toBe(mine[r].terminated);
      }
      steps++;
    }
    expect(compared).toBeGreaterThan(300);
    expect(steps).toBeGreaterThan(40);
    for (const st of [...pooled, ...mine]) st.dispose();
  });

  it('refuses a token the mask does not allow without a round trip; an allowed stop token ends the grammar', async () => {
    const p = pool(1);
    const [st] = await p.start({ type: 'regex', pattern: '[0-9]{2}' }, [EOS]);
    const letter = tok.encode('x', { addSpecialTokens: false })[0];
    expect(st.allows(letter)).toBe(false);
    expect(st.submit(letter)).toBe(false);
    expect(st.allows(EOS[0])).toBe(false);
    for (const t of tok.encode('42', { addSpecialTokens: false })) expect(st.advance(t)).toBe(true);
    expect(st.allows(EOS[0])).toBe(true);
    expect(st.terminated).toBe(false);
    expect(st.advance(EOS[0])).toBe(true);
    expect(st.terminated).toBe(true);
    st.dispose();
  });

  it('a bad grammar is an InvalidParamsError with XGrammar message; the matchers already on that worker run on', async () => {
    const p = pool(1);
    const [good] = await p.start({ type: 'choice', choices: ['still works'] }, [EOS]);
    const bad: [GrammarSpec, RegExp][] = [
      [{ type: 'grammar', grammar: 'root ::= foo' }, /Rule "foo" is not defined/],
      [{ type: 'json_schema', schema: '{"type": "frob"}' }, /Unsupported type "frob"/],
    ];
    for (const [g, msg] of bad) {
      const err = await p.start(g, [EOS, EOS], 'response_format').catch((e: unknown) => e);
      expect(err).toBeInstanceOf(InvalidParamsError);
      expect((err as InvalidParamsError).param).toBe('response_format');
      expect((err as Error).message).toMatch(msg);
    }
    for (const t of tok.encode('still works', { addSpecialTokens: false })) expect(good.advance(t)).toBe(true);
    expect(good.advance(EOS[0])).toBe(true);
    expect(good.terminated).toBe(true);
    good.dispose();
  });

  it('a worker that exits fails its matchers with GrammarEngineError; the next grammar gets a new worker', async () => {
    const p = pool(1);
    const [st] = await p.start({ type: 'regex', pattern: '[a-z]{1,8}' }, [EOS]);
    const a = tok.encode('a', { addSpecialTokens: false })[0];
    const w = (p as unknown as { workers: { worker: Worker }[] }).workers[0].worker;
    const exited = once(w, 'exit');
    await w.terminate();
    await exited;
    expect(st.submit(a)).toBe(true);
    expect(() => st.ready()).toThrow(GrammarEngineError);
    expect(() => st.ready()).toThrow(/exited/);
    st.dispose();
    const [next] = await p.start({ type: 'regex', pattern: '[a-z]{1,8}' }, [EOS]);
    expect(next.advance(a)).toBe(true);
    expect(next.allows(EOS[0])).toBe(true);
    next.dispose();
  });
});
