/**
 * GGUF's `tokenizer.ggml.*` vocabulary ↔ a Hugging Face `tokenizer.json`, for byte-level BPE
 * (`tokenizer.ggml.model` = "gpt2"). GGUF stores the tokens, their types and the merges, and names
 * the pre-tokenizer by family (`tokenizer.ggml.pre`); each family here is the exact HF
 * pre-tokenizer that family's tokenizer.json carries, so a file's tokenizer encodes to the same
 * ids as the HF tokenizer it was made from. SentencePiece vocabularies ("llama": tokens and
 * scores) are read and written too, in the BPE-with-byte-fallback form HF gives them (gguf-spm.ts).
 */
import { GgufError } from './gguf-error.js';
import { MetaReader } from './gguf-meta.js';
import { spmDecoder, spmMerges, spmNormalizer, spmScores, spmSpacing } from './gguf-spm.js';
import { ggufValue, type GgufMetadata, type GgufValue } from './gguf-value.js';

/**
 * Whether decoding cleans spaces before punctuation (HF `clean_up_tokenization_spaces`). llama.cpp
 * has no key for it (it decides by pre-tokenizer family); the HF setting is kept under this key.
 */
export const NERVA_CLEAN_SPACES_KEY = 'nerva.tokenizer.clean_up_tokenization_spaces';

/** llama.cpp's token types (`llama_token_type`). */
export const GGUF_TOKEN_TYPES = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;

const QWEN2_REGEX = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const LLAMA3_REGEX = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

/** The pre-tokenizer families supported, by their `tokenizer.ggml.pre` name. */
export type GgufPreTokenizer = 'gpt-2' | 'qwen2' | 'llama-bpe';

/** Other names llama.cpp gives the same families. */
const PRE_ALIASES: Readonly<Record<string, GgufPreTokenizer>> = {
  'gpt-2': 'gpt-2',
  gpt2: 'gpt-2',
  // llama.cpp's "default" (also what it assumes when the key is absent) is GPT-2's byte-level
  // regex with extra punctuation and digit splits; files that say it are read as GPT-2 byte-level.
  default: 'gpt-2',
  qwen2: 'qwen2',
  'llama-bpe': 'llama-bpe',
  llama3: 'llama-bpe',
  'llama-v3': 'llama-bpe',
};

interface Family {
  normalizer: unknown;
  preTokenizer: unknown;
  decoder: unknown;
  ignoreMerges: boolean;
  /** llama.cpp's `clean_spaces` for the family. */
  cleanSpaces: boolean;
}

function family(pre: GgufPreTokenizer): Family {
  const byteLevel = (useRegex: boolean, trim: boolean) => ({ type: 'ByteLevel', add_prefix_space: false, trim_offsets: trim, use_regex: useRegex });
  const split = (regex: string) => ({ type: 'Split', pattern: { Regex: regex }, behavior: 'Isolated', invert: false });
  switch (pre) {
    case 'gpt-2':
      return { normalizer: null, preTokenizer: byteLevel(true, true), decoder: byteLevel(true, true), ignoreMerges: false, cleanSpaces: true };
    case 'qwen2':
      return {
        normalizer: { type: 'NFC' },
        preTokenizer: { type: 'Sequence', pretokenizers: [split(QWEN2_REGEX), byteLevel(false, false)] },
        decoder: byteLevel(false, false),
        ignoreMerges: false,
        cleanSpaces: false,
      };
    case 'llama-bpe':
      return {
        normalizer: null,
        preTokenizer: { type: 'Sequence', pretokenizers: [split(LLAMA3_REGEX), byteLevel(false, true)] },
        decoder: byteLevel(true, true),
        ignoreMerges: true,
        cleanSpaces: true,
      };
  }
}

/** What a GGUF tokenizer becomes: the arguments of `new NervaTokenizer(...)`. */
export interface GgufTokenizerParts {
  /** A `tokenizer.json`-shaped object. */
  readonly tokenizerJson: Record<string, unknown>;
  /** A `tokenizer_config.json`-shaped object (special tokens, add_bos_token, chat_template). */
  readonly tokenizerConfig: Record<string, unknown>;
  readonly chatTemplate?: string;
  /** The byte-level pre-tokenizer family; absent for a SentencePiece vocabulary. */
  readonly pre?: GgufPreTokenizer;
}

/**
 * The HF tokenizer a GGUF file's metadata describes, or undefined when the file has none
 * (`tokenizer.ggml.model` absent, "none" or "no_vocab"). Throws {@link GgufError}
 * UNSUPPORTED_TOKENIZER for models other than byte-level BPE ("gpt2") and SentencePiece ("llama")
 * and pre-tokenizers outside {@link GgufPreTokenizer}, BAD_METADATA for inconsistent arrays,
 * duplicate tokens or special ids outside the vocabulary.
 */
export function ggufTokenizerParts(metadata: GgufMetadata, path: string): GgufTokenizerParts | undefined {
  const m = new MetaReader(metadata, path);
  const model = m.str('tokenizer.ggml.model');
  if (model === undefined || model === 'none' || model === 'no_vocab') return undefined;
  const spm = model === 'llama';
  if (model !== 'gpt2' && !spm) {
    throw new GgufError('UNSUPPORTED_TOKENIZER', path, `tokenizer model "${model}" is not supported (byte-level BPE "gpt2" and SentencePiece "llama" are)`, { key: 'tokenizer.ggml.model' });
  }
  const preName = m.str('tokenizer.ggml.pre') ?? 'default';
  const pre = spm ? undefined : PRE_ALIASES[preName];
  if (!spm && !pre) {
    throw new GgufError('UNSUPPORTED_TOKENIZER', path, `pre-tokenizer "${preName}" is not supported (supported: ${Object.keys(PRE_ALIASES).join(', ')})`, {
      key: 'tokenizer.ggml.pre',
    });
  }
  const tokens = m.strings('tokenizer.ggml.tokens');
  if (!tokens || tokens.length === 0) throw new GgufError('BAD_METADATA', path, `required for a ${spm ? 'SentencePiece' : 'BPE'} tokenizer`, { key: 'tokenizer.ggml.tokens' });
  const types = m.ints('tokenizer.ggml.token_type');
  if (types && types.length !== tokens.length) {
    throw new GgufError('BAD_METADATA', path, `${types.length} token types for ${tokens.length} tokens`, { key: 'tokenizer.ggml.token_type' });
  }
  const scores = spm ? m.floats('tokenizer.ggml.scores') : undefined;
  if (spm && scores?.length !== tokens.length) {
    throw new GgufError('BAD_METADATA', path, `a SentencePiece vocabulary needs a score a token: ${scores?.length ?? 0} scores for ${tokens.length} tokens`, { key: 'tokenizer.ggml.scores' });
  }
  const merges = m.strings('tokenizer.ggml.merges') ?? [];

  const vocab: Record<string, number> = Object.create(null) as Record<string, number>;
  const added: Record<string, unknown>[] = [];
  tokens.forEach((tok, id) => {
    const type = types?.[id] ?? GGUF_TOKEN_TYPES.NORMAL;
    // Padding entries (llama.cpp fills ids the tokenizer does not use with them) are not tokens.
    if (type === GGUF_TOKEN_TYPES.UNUSED) return;
    if (Object.hasOwn(vocab, tok)) {
      throw new GgufError('BAD_METADATA', path, `token ${JSON.stringify(tok.slice(0, 40))} appears at ids ${vocab[tok]} and ${id}`, { key: 'tokenizer.ggml.tokens' });
    }
    vocab[tok] = id;
    // SentencePiece's unknown token is special too, as transformers' converter makes it.
    if (type === GGUF_TOKEN_TYPES.CONTROL || type === GGUF_TOKEN_TYPES.USER_DEFINED || (spm && type === GGUF_TOKEN_TYPES.UNKNOWN)) {
      added.push({ id, content: tok, single_word: false, lstrip: false, rstrip: false, normalized: false, special: type !== GGUF_TOKEN_TYPES.USER_DEFINED });
    }
  });
  const inVocab = (id: number) => vocab[tokens[id]] === id;
  const pairs = spm
    ? spmMerges(tokens, scores!, inVocab)
    : merges.map((s, i) => splitMerge(s) ?? refuseMerge(path, i, s));

  const special = (key: string): { id: number; content: string } | undefined => {
    if (!m.has(key)) return undefined;
    const id = m.int(key);
    if (id >= tokens.length) throw new GgufError('BAD_METADATA', path, `token id ${id} is outside the ${tokens.length}-token vocabulary`, { key });
    return { id, content: tokens[id] };
  };
  const bos = special('tokenizer.ggml.bos_token_id');
  const eos = special('tokenizer.ggml.eos_token_id');
  const pad = special('tokenizer.ggml.padding_token_id');
  const unk = special('tokenizer.ggml.unknown_token_id');
  // llama.cpp adds BOS by default for SentencePiece and Llama 3's BPE.
  const addBos = m.bool('tokenizer.ggml.add_bos_token') ?? (spm || pre === 'llama-bpe');
  const addEos = m.bool('tokenizer.ggml.add_eos_token') ?? false;
  if (addBos && !bos) throw new GgufError('BAD_METADATA', path, 'add_bos_token is set but there is no bos_token_id', { key: 'tokenizer.ggml.add_bos_token' });
  if (addEos && !eos) throw new GgufError('BAD_METADATA', path, 'add_eos_token is set but there is no eos_token_id', { key: 'tokenizer.ggml.add_eos_token' });

  const fam = pre ? family(pre) : spmFamily(m.bool('tokenizer.ggml.add_space_prefix') ?? true);
  const tokenizerJson: Record<string, unknown> = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: fam.normalizer,
    pre_tokenizer: fam.preTokenizer,
    post_processor: addBos || addEos ? templateProcessing(addBos ? bos : undefined, addEos ? eos : undefined) : null,
    decoder: fam.decoder,
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: spm ? (unk ?? { content: tokens[0] }).content : null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: spm,
      byte_fallback: spm,
      ignore_merges: fam.ignoreMerges,
      vocab,
      merges: pairs,
    },
  };
  const chatTemplate = m.str('tokenizer.chat_template');
  const tokenizerConfig: Record<string, unknown> = {
    bos_token: bos?.content ?? null,
    eos_token: eos?.content ?? null,
    pad_token: pad?.content ?? null,
    unk_token: unk?.content ?? null,
    add_bos_token: addBos,
    add_eos_token: addEos,
    clean_up_tokenization_spaces: m.bool(NERVA_CLEAN_SPACES_KEY) ?? fam.cleanSpaces,
  };
  if (chatTemplate !== undefined) tokenizerConfig.chat_template = chatTemplate;
  return { tokenizerJson, tokenizerConfig, ...(chatTemplate !== undefined && { chatTemplate }), ...(pre && { pre }) };
}

/** SentencePiece as a family: its normalizer and decoder (no pre-tokenizer), llama.cpp's spacing. */
function spmFamily(addSpacePrefix: boolean): Family {
  return { normalizer: spmNormalizer(addSpacePrefix), preTokenizer: null, decoder: spmDecoder(addSpacePrefix), ignoreMerges: false, cleanSpaces: false };
}

function templateProcessing(bos?: { id: number; content: string }, eos?: { id: number; content: string }): Record<string, unknown> {
  const tok = (t: { content: string }) => ({ SpecialToken: { id: t.content, type_id: 0 } });
  const seq = (id: 'A' | 'B', typeId: number) => ({ Sequence: { id, type_id: typeId } });
  const one = (id: 'A' | 'B', typeId: number) => [...(bos ? [tok(bos)] : []), seq(id, typeId), ...(eos ? [tok(eos)] : [])];
  const specials: Record<string, unknown> = {};
  for (const t of [bos, eos]) if (t) specials[t.content] = { id: t.content, ids: [t.id], tokens: [t.content] };
  return { type: 'TemplateProcessing', single: one('A', 0), pair: [...one('A', 0), ...one('B', 1)], special_tokens: specials };
}

/** What a HF tokenizer needs to become GGUF metadata. */
export interface HfTokenizerSource {
  /** Parsed `tokenizer.json`. */
  readonly tokenizerJson: unknown;
  /** Parsed `tokenizer_config.json` ({} when absent). */
  readonly tokenizerConfig?: unknown;
  /** The chat template (chat_template.jinja, or the config's). */
  readonly chatTemplate?: string;
  /** Rows of the token embedding: llama.cpp requires exactly this many tokens. */
  readonly vocabRows: number;
  /** config.json's ids, used when the tokenizer config names no BOS / EOS. */
  readonly bosTokenId?: number;
  readonly eosTokenId?: number;
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function sameJson(a: unknown, b: unknown): boolean {
  if (isObj(a) && isObj(b)) {
    const ka = Object.keys(a).filter((k) => a[k] !== undefined);
    const kb = Object.keys(b).filter((k) => b[k] !== undefined);
    return ka.length === kb.length && ka.every((k) => sameJson(a[k], b[k]));
  }
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => sameJson(x, b[i]));
  return a === b;
}

/** The family of a tokenizer.json's normalizer + pre-tokenizer, or undefined when it is none of them. */
function detectFamily(tj: Record<string, unknown>): GgufPreTokenizer | undefined {
  const pre = tj.pre_tokenizer;
  if (!isObj(pre)) return undefined;
  const norm = tj.normalizer ?? null;
  const model = tj.model as Record<string, unknown>;
  const ignoreMerges = model.ignore_merges === true;
  if (pre.type === 'ByteLevel') {
    return pre.use_regex !== false && pre.add_prefix_space !== true && norm === null && !ignoreMerges ? 'gpt-2' : undefined;
  }
  if (pre.type !== 'Sequence' || !Array.isArray(pre.pretokenizers) || pre.pretokenizers.length !== 2) return undefined;
  const [split, bl] = pre.pretokenizers as unknown[];
  if (!isObj(split) || !isObj(bl) || split.type !== 'Split' || bl.type !== 'ByteLevel' || bl.use_regex !== false || bl.add_prefix_space === true) return undefined;
  if (split.behavior !== 'Isolated' || split.invert === true || !isObj(split.pattern)) return undefined;
  const regex = split.pattern.Regex;
  if (regex === QWEN2_REGEX && sameJson(norm, { type: 'NFC' }) && !ignoreMerges) return 'qwen2';
  if (regex === LLAMA3_REGEX && norm === null && ignoreMerges) return 'llama-bpe';
  return undefined;
}

/** The [first special, last special] token contents a post-processor adds around a sequence. */
function addedSpecials(pp: unknown): { first?: string; last?: string } | 'unsupported' {
  if (pp === null || pp === undefined) return {};
  if (!isObj(pp)) return 'unsupported';
  if (pp.type === 'ByteLevel') return {};
  if (pp.type === 'Sequence' && Array.isArray(pp.processors)) {
    let found: { first?: string; last?: string } = {};
    for (const p of pp.processors) {
      const r = addedSpecials(p);
      if (r === 'unsupported') return r;
      if (r.first !== undefined || r.last !== undefined) found = r;
    }
    return found;
  }
  if (pp.type !== 'TemplateProcessing' || !Array.isArray(pp.single)) return 'unsupported';
  const items = pp.single as Record<string, { id?: unknown }>[];
  const seqAt = items.findIndex((x) => isObj(x) && 'Sequence' in x);
  if (seqAt < 0 || seqAt > 1 || items.length - seqAt > 2 || items.filter((x) => 'Sequence' in x).length !== 1) return 'unsupported';
  const content = (x: Record<string, { id?: unknown }> | undefined): string | undefined =>
    x && isObj(x.SpecialToken) && typeof x.SpecialToken.id === 'string' ? x.SpecialToken.id : undefined;
  const first = seqAt === 1 ? content(items[0]) : undefined;
  const last = items.length - seqAt === 2 ? content(items[seqAt + 1]) : undefined;
  if ((seqAt === 1 && first === undefined) || (items.length - seqAt === 2 && last === undefined)) return 'unsupported';
  return { ...(first !== undefined && { first }), ...(last !== undefined && { last }) };
}

/**
 * A merge written "a b" as its two halves: the first space at or after index 1 separates them (a
 * half may itself start with one). Undefined when there is no such space.
 */
function splitMerge(mg: string): [string, string] | undefined {
  const at = mg.indexOf(' ', 1);
  return at < 0 ? undefined : [mg.slice(0, at), mg.slice(at + 1)];
}

function refuseMerge(path: string, i: number, s: string): never {
  throw new GgufError('BAD_METADATA', path, `merge #${i} ${JSON.stringify(s.slice(0, 40))} is not two tokens separated by a space`, { key: 'tokenizer.ggml.merges' });
}

function specialContent(v: unknown): string | undefined {
  if (typeof v === 'string') return v;
  if (isObj(v) && typeof v.content === 'string') return v.content;
  return undefined;
}

/**
 * The `tokenizer.*` metadata of a HF byte-level BPE tokenizer, as llama.cpp's converter writes
 * it: tokens padded to the embedding's rows with `[PADn]` (UNUSED), added tokens CONTROL when
 * special and USER_DEFINED otherwise, merges as "a b", the pre-tokenizer family, BOS/EOS/PAD ids,
 * add_bos/add_eos from the post-processor, and the chat template. Throws {@link GgufError}
 * UNSUPPORTED_TOKENIZER (naming why) for tokenizers that have no faithful GGUF form.
 */
export function ggufTokenizerMetadata(src: HfTokenizerSource, path = '<gguf>'): [string, GgufValue][] {
  const refuse = (why: string): never => {
    throw new GgufError('UNSUPPORTED_TOKENIZER', path, `the tokenizer has no faithful GGUF form: ${why}`);
  };
  const tj = src.tokenizerJson;
  if (!isObj(tj) || !isObj(tj.model)) return refuse('tokenizer.json has no "model" section');
  const model = tj.model;
  if (model.type !== 'BPE') refuse(`model type "${String(model.type)}" is not BPE`);
  // BPE over characters with byte fallback is SentencePiece's, written as a "llama" vocabulary.
  const spm = model.byte_fallback === true;
  for (const k of ['continuing_subword_prefix', 'end_of_word_suffix'] as const) {
    if (model[k] !== undefined && model[k] !== null && model[k] !== '') refuse(`model.${k} is set`);
  }
  if (model.dropout !== undefined && model.dropout !== null) refuse('model.dropout is set');
  const spacing = spm
    ? (spmSpacing(tj) ??
      refuse(
        "byte_fallback BPE whose normalizer / pre-tokenizer is not SentencePiece's (Prepend + Replace of ' ' by '▁'); a Metaspace pre-tokenizer adds no '▁' before text that starts with a space or follows a special token, where llama.cpp's SentencePiece does",
      ))
    : undefined;
  const pre = spm ? undefined : (detectFamily(tj) ?? refuse('its normalizer / pre-tokenizer is not one of the GPT-2, Qwen2 or Llama 3 byte-level families'));
  if (!spm && (!isObj(tj.decoder) || tj.decoder.type !== 'ByteLevel')) refuse('its decoder is not ByteLevel');
  if (!isObj(model.vocab)) return refuse('model.vocab is not an object');

  const byId = new Map<number, string>();
  const addToken = (id: unknown, tok: string): void => {
    if (!Number.isSafeInteger(id) || (id as number) < 0) refuse(`token ${JSON.stringify(tok)} has id ${String(id)}`);
    const prev = byId.get(id as number);
    if (prev !== undefined && prev !== tok) refuse(`id ${String(id)} is both ${JSON.stringify(prev)} and ${JSON.stringify(tok)}`);
    byId.set(id as number, tok);
  };
  for (const [tok, id] of Object.entries(model.vocab)) addToken(id, tok);
  const addedType = new Map<number, number>();
  for (const a of Array.isArray(tj.added_tokens) ? tj.added_tokens : []) {
    if (!isObj(a) || typeof a.content !== 'string') refuse('an added_tokens entry has no content');
    const e = a as Record<string, unknown>;
    addToken(e.id, e.content as string);
    addedType.set(e.id as number, e.special === true ? GGUF_TOKEN_TYPES.CONTROL : GGUF_TOKEN_TYPES.USER_DEFINED);
  }
  let maxId = -1;
  for (const id of byId.keys()) if (id > maxId) maxId = id;
  if (maxId >= src.vocabRows) refuse(`token id ${maxId} is past the ${src.vocabRows} rows of the token embedding`);
  const tokens: string[] = new Array<string>(src.vocabRows);
  const types: number[] = new Array<number>(src.vocabRows);
  const taken = new Set(byId.values());
  for (let id = 0; id < src.vocabRows; id++) {
    const t = byId.get(id);
    if (t !== undefined) {
      tokens[id] = t;
      types[id] = addedType.get(id) ?? (spm && /^<0x[0-9A-F]{2}>$/.test(t) ? GGUF_TOKEN_TYPES.BYTE : spm && t === model.unk_token ? GGUF_TOKEN_TYPES.UNKNOWN : GGUF_TOKEN_TYPES.NORMAL);
    } else {
      const padName = `[PAD${id}]`;
      if (taken.has(padName)) refuse(`the padding name ${padName} is already a token`);
      tokens[id] = padName;
      types[id] = GGUF_TOKEN_TYPES.UNUSED;
    }
  }
  const merges = (Array.isArray(model.merges) ? model.merges : []).map((mg, i) => {
    if (typeof mg === 'string') return mg;
    if (!Array.isArray(mg) || mg.length !== 2 || !mg.every((x) => typeof x === 'string')) return refuse(`merge #${i} is not a pair of strings`);
    if ((mg as string[]).some((x) => x.includes(' '))) refuse(`merge #${i} has a space inside a token, which GGUF's "a b" form cannot hold`);
    return `${mg[0]} ${mg[1]}`;
  });

  const cfg = isObj(src.tokenizerConfig) ? src.tokenizerConfig : {};
  const idOf = (content: string | undefined): number | undefined => {
    if (content === undefined) return undefined;
    for (const [id, t] of byId) if (t === content) return id;
    return refuse(`special token ${JSON.stringify(content)} is not in the vocabulary`);
  };
  const specials = addedSpecials(tj.post_processor);
  if (specials === 'unsupported') return refuse('its post-processor adds tokens in a way GGUF cannot say (only a BOS before and an EOS after)');
  const bosId = idOf(specials.first) ?? idOf(specialContent(cfg.bos_token)) ?? src.bosTokenId;
  const eosId = idOf(specials.last) ?? idOf(specialContent(cfg.eos_token)) ?? src.eosTokenId;
  const padId = idOf(specialContent(cfg.pad_token));

  const v = ggufValue;
  const md: [string, GgufValue][] = spm
    ? [
        ['tokenizer.ggml.model', v.str('llama')],
        ['tokenizer.ggml.pre', v.str('default')],
        ['tokenizer.ggml.tokens', v.array('STRING', tokens)],
        ['tokenizer.ggml.scores', v.array('FLOAT32', spmScores(tokens, merges.map((mg, i) => splitMerge(mg) ?? refuse(`merge #${i} ${JSON.stringify(mg.slice(0, 40))} is not two tokens`))))],
        ['tokenizer.ggml.token_type', v.array('INT32', types)],
        ['tokenizer.ggml.add_space_prefix', v.bool(spacing!.addSpacePrefix)],
      ]
    : [
        ['tokenizer.ggml.model', v.str('gpt2')],
        ['tokenizer.ggml.pre', v.str(pre!)],
        ['tokenizer.ggml.tokens', v.array('STRING', tokens)],
        ['tokenizer.ggml.token_type', v.array('INT32', types)],
        ['tokenizer.ggml.merges', v.array('STRING', merges)],
      ];
  const unkId = spm && typeof model.unk_token === 'string' ? idOf(model.unk_token) : undefined;
  if (unkId !== undefined) md.push(['tokenizer.ggml.unknown_token_id', v.u32(unkId)]);
  if (bosId !== undefined) md.push(['tokenizer.ggml.bos_token_id', v.u32(bosId)]);
  if (eosId !== undefined) md.push(['tokenizer.ggml.eos_token_id', v.u32(eosId)]);
  if (padId !== undefined) md.push(['tokenizer.ggml.padding_token_id', v.u32(padId)]);
  // Always explicit: llama.cpp's default differs by family (llama-bpe adds BOS unless told not to).
  md.push(['tokenizer.ggml.add_bos_token', v.bool(specials.first !== undefined)], ['tokenizer.ggml.add_eos_token', v.bool(specials.last !== undefined)]);
  if (src.chatTemplate !== undefined) md.push(['tokenizer.chat_template', v.str(src.chatTemplate)]);
  // HF's default when the config does not say (and the tokenizer library's).
  md.push([NERVA_CLEAN_SPACES_KEY, v.bool(cfg.clean_up_tokenization_spaces !== false)]);
  return md;
}
