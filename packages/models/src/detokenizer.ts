import type { NervaTokenizer } from './tokenizer.js';

/** Streaming text for a growing sequence of token ids. */
export interface Detokenizer {
  /** Add one generated id; returns the newly completed text (possibly empty). */
  push(id: number): string;
  /** End of stream: returns whatever text was held back (may contain U+FFFD if the bytes really were invalid). */
  flush(): string;
  /** All text emitted so far. */
  readonly text: string;
}

export interface DetokenizerOptions {
  skipSpecialTokens?: boolean;
  /**
   * The prompt's ids. Its last few give decoding context, so a first generated token that starts
   * with a space (or a SentencePiece `▁`) keeps it. They are never emitted themselves.
   */
  promptIds?: readonly number[];
}

/** Prompt ids kept as context; enough for any decoder's leading-space rule. */
const CONTEXT_TOKENS = 5;
const REPLACEMENT = '\uFFFD';

/**
 * Incremental detokenizer. Byte-level BPE splits a multi-byte character (emoji, CJK) across
 * tokens, and decoding a prefix then shows U+FFFD. Like vLLM's detokenizer, we keep two offsets:
 * `prefixOffset` (start of the window decoded for context) and `readOffset` (end of what has been
 * emitted). Each push decodes [prefixOffset, end) and emits only the part beyond the decoded
 * [prefixOffset, readOffset); text ending in U+FFFD is held back until later bytes complete it.
 * Decoding a window instead of single tokens keeps per-token cost bounded and context-correct.
 */
export function createDetokenizer(tokenizer: NervaTokenizer, opts: DetokenizerOptions = {}): Detokenizer {
  const decodeOpts = { skipSpecialTokens: opts.skipSpecialTokens ?? false };
  const ids: number[] = opts.promptIds ? opts.promptIds.filter((id) => tokenizer.hasId(id)).slice(-CONTEXT_TOKENS) : [];
  let prefixOffset = 0;
  let readOffset = ids.length;
  let text = '';

  const pending = (): string => {
    const prefix = tokenizer.decode(ids.slice(prefixOffset, readOffset), decodeOpts);
    const full = tokenizer.decode(ids.slice(prefixOffset), decodeOpts);
    return full.length > prefix.length ? full.slice(prefix.length) : '';
  };

  return {
    push(id: number): string {
      // An id without a token (a padded checkpoint's extra rows) has no text; it must not end the stream.
      if (!tokenizer.hasId(id)) return '';
      ids.push(id);
      const prefix = tokenizer.decode(ids.slice(prefixOffset, readOffset), decodeOpts);
      const full = tokenizer.decode(ids.slice(prefixOffset), decodeOpts);
      if (full.length <= prefix.length || full.endsWith(REPLACEMENT)) return '';
      const delta = full.slice(prefix.length);
      prefixOffset = readOffset;
      readOffset = ids.length;
      text += delta;
      return delta;
    },
    flush(): string {
      const delta = pending();
      prefixOffset = readOffset = ids.length;
      text += delta;
      return delta;
    },
    get text() {
      return text;
    },
  };
}
