import type { NervaTokenizer } from '@nerva/models';

/** How XGrammar reads a vocabulary's token strings (its TokenizerInfo vocab types). */
export type VocabType = 'byte_level' | 'byte_fallback' | 'raw';

/** A tokenizer's vocabulary as XGrammar takes it: one string per id, and how to decode them. */
export interface EncodedVocab {
  tokens: string[];
  type: VocabType;
  /** Whether the tokenizer prepends a space (SentencePiece's `▁`) to the text it encodes. */
  prependSpace: boolean;
}

/**
 * The characters GPT-2's byte-level BPE writes each byte as (printable bytes as themselves, the
 * others shifted past U+0100): the table byte_level token strings are spelled in.
 */
export function byteLevelChars(): string[] {
  const chars: string[] = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    chars[b] = String.fromCharCode(printable ? b : next++);
  }
  return chars;
}

/**
 * The vocabulary of `tok` for ids [0, size) (size: the logit row's, which may exceed the
 * tokenizer's). Ids without a token and special tokens (`<|im_end|>`, ...) are empty strings,
 * which XGrammar never allows inside a grammar: a special token can end a request (a stop token)
 * but is never text of the output. Added tokens that are not special (Qwen's `<tool_call>`) stay:
 * their text is what a grammar may ask for.
 */
export function encodeVocab(tok: NervaTokenizer, size: number): EncodedVocab {
  const tokens: string[] = new Array(size);
  for (let id = 0; id < size; id++) {
    const s = id < tok.vocabSize ? tok.tokenToString(id) : undefined;
    tokens[id] = s === undefined || tok.isSpecial(id) ? '' : s;
  }
  return { tokens, ...vocabTypeOf(tok, tokens) };
}

/**
 * Byte-level BPE (GPT-2, Llama 3, Qwen) has a one-character token for each of the 256 byte
 * characters; SentencePiece with byte fallback (Llama 2, Mistral) has the 256 `<0xAB>` tokens and
 * `▁` for a space; anything else is read as raw text.
 */
function vocabTypeOf(tok: NervaTokenizer, tokens: string[]): { type: VocabType; prependSpace: boolean } {
  const present = new Set(tokens);
  let fallback = 0;
  for (let b = 0; b < 256; b++) if (present.has(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`)) fallback++;
  if (fallback === 256) {
    const first = tok.encode('a', { addSpecialTokens: false })[0];
    const prependSpace = first !== undefined && (tok.tokenToString(first) ?? '').startsWith('\u2581');
    return { type: 'byte_fallback', prependSpace };
  }
  if (byteLevelChars().every((c) => present.has(c))) return { type: 'byte_level', prependSpace: false };
  return { type: 'raw', prependSpace: false };
}
