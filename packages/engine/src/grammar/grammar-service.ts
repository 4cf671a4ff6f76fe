import type { NervaTokenizer } from '@nerva/models';
import { InvalidParamsError } from '../sampling-params.js';
import { InThreadGrammarState } from './grammar-state.js';
import { expandBoundedStrings } from './bounded-strings.js';
import { formatForXGrammar, schemaForXGrammar } from './schema-rewrites.js';
import { grammarKey, type GrammarSpec } from './spec.js';
import { byteLevelChars, type EncodedVocab, encodeVocab } from './vocab.js';
import { GrammarEngineError, XGrammarRuntime, type XgCompiler, type XgHandle, type XgTokenizerInfo } from './xgrammar-runtime.js';

/** One XGrammar instance with a vocabulary and a compiler over it. */
interface Compiling {
  rt: XGrammarRuntime;
  info: XgTokenizerInfo;
  compiler: XgCompiler;
  vocabSize: number;
}

async function compilingOver(tokens: string[], type: string, prependSpace: boolean, stopIds: number[]): Promise<Compiling> {
  const rt = await XGrammarRuntime.create();
  const info = await rt.callAsync('reading the vocabulary', () => rt.api.TokenizerInfo.createTokenizerInfo(tokens, type, prependSpace, tokens.length, stopIds));
  const compiler = await rt.callAsync('creating the compiler', () => rt.api.GrammarCompiler.createGrammarCompiler(info, false));
  return { rt, info, compiler, vocabSize: tokens.length };
}

/** JSON's separators in every grammar: Python's json.dumps defaults, `{"a": 1, "b": [2, 3]}`. */
const SEPARATORS = { first: ', ', second: ': ' };

/** Compile `g` with `c` (XGrammar's entry point for each kind of grammar). */
function compileWith(c: Compiling, g: GrammarSpec): XgHandle {
  const h = c.compiler.handle;
  return c.rt.call('compiling the grammar', () => {
    switch (g.type) {
      case 'json_schema':
        // No free whitespace, Python's separators: `{"a": 1, "b": [2, 3]}`; length-bounded
        // strings spelled as bounded-strings.ts says.
        return compileEbnf(c, schemaEbnf(c, schemaForXGrammar(JSON.parse(g.schema as string)), g.strict ?? true, true));
      case 'json_object':
        return h.CompileJSONSchema('{"type": "object"}', false, undefined, SEPARATORS, false, undefined);
      case 'regex':
        return h.CompileStructuralTag(JSON.stringify({ type: 'structural_tag', format: { type: 'regex', pattern: g.pattern } }));
      case 'choice':
        return h.CompileStructuralTag(JSON.stringify({ type: 'structural_tag', format: { type: 'or', elements: g.choices.map((value) => ({ type: 'const_string', value })) } }));
      case 'grammar':
        return compileEbnf(c, g.grammar, g.root ?? 'root');
      case 'structural_tag':
        return h.CompileStructuralTag(JSON.stringify({ type: 'structural_tag', format: compactJsonFormats(c, formatForXGrammar(g.format)) }));
    }
  });
}

function compileEbnf(c: Compiling, ebnf: string, root = 'root'): XgHandle {
  const grammar = c.rt.binding.Grammar.FromEBNF(ebnf, root);
  try {
    return c.compiler.handle.CompileGrammar(grammar);
  } finally {
    grammar.delete();
  }
}

/**
 * XGrammar's EBNF for a (rewritten) JSON Schema: compact JSON, bounded strings expanded
 * (`wholeOutput`: nothing follows the JSON, as bounded-strings.ts's lookahead needs).
 */
function schemaEbnf(c: Compiling, schema: unknown, strict: boolean, wholeOutput: boolean): string {
  const b = c.rt.binding;
  return expandBoundedStrings(b._JSONSchemaToEBNF(JSON.stringify(schema), false, undefined, SEPARATORS, strict, undefined, b.JSONFormat.kJSON), wholeOutput);
}

/**
 * A structural tag's format whose JSON Schema elements are spelled as EBNF without free whitespace
 * (a structural tag's own json_schema element allows any whitespace between tokens, which a model
 * could emit forever instead of closing the JSON): the same compact JSON as a json_schema grammar.
 */
function compactJsonFormats(c: Compiling, format: unknown): unknown {
  if (Array.isArray(format)) return format.map((f) => compactJsonFormats(c, f));
  if (format === null || typeof format !== 'object') return format;
  const f = format as Record<string, unknown>;
  if (f.type === 'json_schema' && 'json_schema' in f) {
    return { type: 'grammar', grammar: schemaEbnf(c, f.json_schema, true, false) };
  }
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(f)) out[k] = compactJsonFormats(c, v);
  return out;
}

/**
 * XGrammar instance that checks grammars before any serving instance compiles them: an abort
 * (XGrammar's way of reporting a bad grammar) kills only this one, over a vocabulary of the 256
 * bytes, and the next check builds a new one.
 */
let checker: Promise<Compiling> | undefined;

/**
 * Check that `g` compiles (XGrammar's parser and compiler over a byte vocabulary; no model
 * needed): resolves, or rejects with InvalidParamsError naming `param` and carrying XGrammar's
 * message. A front end calls it before it answers, so a bad grammar is a 400, not a failed stream.
 */
export async function checkGrammar(g: GrammarSpec, param = 'grammar'): Promise<void> {
  checker ??= compilingOver([...byteLevelChars(), ''], 'byte_level', false, [256]);
  let c: Compiling;
  try {
    c = await checker;
  } catch (e) {
    checker = undefined;
    throw e;
  }
  try {
    compileWith(c, g).delete();
  } catch (e) {
    if (c.rt.dead) checker = undefined;
    throw asParamError(e, param);
  }
}

function asParamError(e: unknown, param: string): Error {
  if (e instanceof GrammarEngineError && e.code === 'ABORTED') return new InvalidParamsError(param, `the grammar does not compile: ${e.message.replace(/^compiling the grammar: /, '')}`);
  return e instanceof Error ? e : new Error(String(e));
}

/** A grammar compiled for a model's vocabulary: matchers for its requests. */
export interface CompiledGrammar {
  /**
   * A matcher at the start of the grammar, with its first mask computed (into `mask` when given:
   * a grammar worker's shared buffer).
   */
  start(stopTokenIds: readonly number[], mask?: Int32Array): InThreadGrammarState;
}

/**
 * Constrained decoding for one tokenizer: an XGrammar instance over its vocabulary (built on the
 * first grammar request: ~0.4 s for Qwen3's 151,936 ids), a cache of compiled grammars, and the
 * matchers of the requests. A grammar is checked (checkGrammar) before it reaches this instance;
 * should this one abort anyway, it is dropped with the requests it served and the next grammar
 * builds a new one.
 */
export class GrammarService {
  private serving: Promise<Compiling> | undefined;
  private readonly cache = new Map<string, XgHandle>();

  /**
   * @param tokenizer the model's tokenizer, or its vocabulary as encodeVocab gives it (a grammar worker's)
   * @param vocabSize ids of a logit row (may exceed the tokenizer's: padded ids are never allowed)
   * @param eosTokenIds the model's end-of-sequence ids (the grammars' default stop tokens)
   */
  constructor(
    private readonly tokenizer: NervaTokenizer | EncodedVocab,
    readonly vocabSize: number,
    private readonly eosTokenIds: readonly number[],
  ) {}

  /** Words of one token mask (32 ids a word). */
  get maskWords(): number {
    return Math.ceil(this.vocabSize / 32);
  }

  /** Check and compile `g` (cached by its normalized form); rejects with InvalidParamsError for a bad grammar. */
  async compile(g: GrammarSpec, param = 'grammar'): Promise<CompiledGrammar> {
    await checkGrammar(g, param);
    const c = await this.instance();
    const key = grammarKey(g);
    let h = this.cache.get(key);
    if (h === undefined) {
      try {
        h = compileWith(c, g);
      } catch (e) {
        if (c.rt.dead) this.drop(c);
        throw asParamError(e, param);
      }
      // A small LRU: the oldest compiled grammar goes when the cache is full.
      if (this.cache.size >= 64) {
        const [k0, h0] = this.cache.entries().next().value as [string, XgHandle];
        this.cache.delete(k0);
        h0.delete();
      }
      this.cache.set(key, h);
    } else {
      this.cache.delete(key);
      this.cache.set(key, h);
    }
    const compiled = h;
    return {
      start: (stopTokenIds, mask) => {
        try {
          return new InThreadGrammarState(c.rt, compiled, stopTokenIds.length > 0 ? stopTokenIds : this.eosTokenIds, c.vocabSize, mask);
        } catch (e) {
          if (c.rt.dead) this.drop(c);
          throw e;
        }
      },
    };
  }

  /** Build the XGrammar instance over the vocabulary now (it is otherwise built by the first compile). */
  async prepare(): Promise<void> {
    await this.instance();
  }

  private instance(): Promise<Compiling> {
    if (!this.serving) {
      const t = this.tokenizer;
      const v = isEncodedVocab(t) ? t : encodeVocab(t, this.vocabSize);
      this.serving = compilingOver(v.tokens, v.type, v.prependSpace, [...this.eosTokenIds]);
      this.serving.catch(() => (this.serving = undefined));
    }
    return this.serving;
  }

  /** Forget an instance that aborted (its grammars and matchers with it). */
  private drop(c: Compiling): void {
    void this.serving?.then((s) => {
      if (s === c) {
        this.serving = undefined;
        this.cache.clear();
      }
    });
  }

  /** Free the compiled grammars (the context is disposed). */
  dispose(): void {
    if (this.serving) {
      void this.serving.then((c) => {
        if (!c.rt.dead) for (const h of this.cache.values()) h.delete();
        this.cache.clear();
      }, () => undefined);
    }
    this.serving = undefined;
  }
}

export { GrammarEngineError };

function isEncodedVocab(t: NervaTokenizer | EncodedVocab): t is EncodedVocab {
  return Array.isArray((t as EncodedVocab).tokens);
}
