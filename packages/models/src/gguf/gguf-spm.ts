/**
 * GGUF's SentencePiece vocabularies (`tokenizer.ggml.model` = "llama": Llama 2, Mistral,
 * TinyLlama, CodeLlama...) in the Hugging Face form transformers' converter gives them: a BPE model
 * over characters with byte fallback, spaces as `▁`, one `▁` in front of the text.
 *
 * llama.cpp's SentencePiece tokenizer starts from characters and keeps merging the adjacent pair
 * whose concatenation is the best-scoring token (the leftmost on a tie); a character no token
 * holds becomes its bytes' `<0xXX>` tokens. A BPE model whose merges are every split of every
 * token into two tokens, ranked by the whole token's score, merges the same pairs in the same
 * order.
 */

/** SentencePiece's visible space. */
export const SPM_SPACE = '\u2581';

/**
 * The BPE merges a SentencePiece vocabulary implies: each way of writing a token as two tokens,
 * ordered by the token's score (highest first), then by the ids of the token and of its halves.
 * `inVocab` says which ids the vocabulary holds (padding entries are not tokens).
 */
export function spmMerges(tokens: readonly string[], scores: readonly number[], inVocab: (id: number) => boolean): [string, string][] {
  const id = new Map<string, number>();
  tokens.forEach((t, i) => {
    if (inVocab(i)) id.set(t, i);
  });
  const found: { l: string; r: string; score: number; id: number; lid: number; rid: number }[] = [];
  tokens.forEach((t, i) => {
    if (!inVocab(i)) return;
    const chars = Array.from(t);
    for (let k = 1; k < chars.length; k++) {
      const l = chars.slice(0, k).join('');
      const r = chars.slice(k).join('');
      const lid = id.get(l);
      const rid = id.get(r);
      if (lid !== undefined && rid !== undefined) found.push({ l, r, score: scores[i], id: i, lid, rid });
    }
  });
  found.sort((a, b) => b.score - a.score || a.id - b.id || a.lid - b.lid || a.rid - b.rid);
  return found.map((f) => [f.l, f.r]);
}

/** The normalizer: spaces as `▁`, and one `▁` in front when the vocabulary adds a space prefix. */
export function spmNormalizer(addSpacePrefix: boolean): unknown {
  const replace = { type: 'Replace', pattern: { String: ' ' }, content: SPM_SPACE };
  return addSpacePrefix ? { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: SPM_SPACE }, replace] } : replace;
}

/** The decoder: `▁` back to spaces, `<0xXX>` tokens back to bytes, the prefixed space dropped. */
export function spmDecoder(addSpacePrefix: boolean): unknown {
  const steps: unknown[] = [{ type: 'Replace', pattern: { String: SPM_SPACE }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }];
  if (addSpacePrefix) steps.push({ type: 'Strip', content: ' ', start: 1, stop: 0 });
  return { type: 'Sequence', decoders: steps };
}
