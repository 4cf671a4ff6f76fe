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

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * Whether a tokenizer.json writes spaces as SentencePiece does (`▁`, no other splitting), and
 * whether it puts one `▁` in front: the legacy normalizer form (Prepend + Replace). Undefined for
 * anything else, the Metaspace pre-tokenizer included: it adds no `▁` before text that already
 * starts with a space, or after a special token, where SentencePiece (and llama.cpp) do, so a
 * GGUF file cannot say it.
 */
export function spmSpacing(tj: Record<string, unknown>): { readonly addSpacePrefix: boolean } | undefined {
  const norm = tj.normalizer ?? null;
  const pre = tj.pre_tokenizer ?? null;
  const isReplace = (x: unknown) => isObj(x) && x.type === 'Replace' && isObj(x.pattern) && x.pattern.String === ' ' && x.content === SPM_SPACE;
  const isPrepend = (x: unknown) => isObj(x) && x.type === 'Prepend' && x.prepend === SPM_SPACE;
  if (pre !== null) return undefined;
  if (isReplace(norm)) return { addSpacePrefix: false };
  if (isObj(norm) && norm.type === 'Sequence' && Array.isArray(norm.normalizers) && norm.normalizers.length === 2 && isPrepend(norm.normalizers[0]) && isReplace(norm.normalizers[1])) {
    return { addSpacePrefix: true };
  }
  return undefined;
}

/**
 * SentencePiece scores that give a BPE tokenizer's merges back through {@link spmMerges}: a token
 * scores minus the rank of the first merge that makes it; a token no merge makes scores below
 * every other.
 */
export function spmScores(tokens: readonly string[], merges: readonly (readonly [string, string])[]): number[] {
  const rank = new Map<string, number>();
  merges.forEach(([a, b], r) => {
    if (!rank.has(a + b)) rank.set(a + b, r);
  });
  return tokens.map((t) => -(rank.get(t) ?? merges.length + 1));
}
