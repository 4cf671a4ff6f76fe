import { sampleRow, sampleRowMasked, uniformFromSeed } from '@nerva/core';
import type { ResolvedSamplingParams } from './sampling-params.js';

export interface TokenLogprob {
  token: number;
  logprob: number;
}

export interface SampledToken {
  token: number;
  logprob?: number;
  topLogprobs?: TokenLogprob[];
}

/**
 * The host side of sampling: penalties, logit bias, bans, token masks (constrained decoding) and
 * logprobs, then the shared sampling rule
 * of core (the same rule the device `sample` op runs). Scratch is allocated once per vocab.
 */
export class HostSampler {
  private readonly row: Float32Array;
  private readonly scratch: { idx: Int32Array; prob: Float64Array; vals: Float32Array; ids: Int32Array };

  /**
   * @param vocab the logit row's length (its stride)
   * @param limit ids sampled and reported are below it (the tokenizer's id space; default vocab)
   */
  constructor(
    readonly vocab: number,
    readonly limit: number = vocab,
  ) {
    this.row = new Float32Array(limit);
    this.scratch = { idx: new Int32Array(limit), prob: new Float64Array(limit), vals: new Float32Array(limit), ids: new Int32Array(limit) };
  }

  /**
   * @param counter the request's rng counter (number of tokens it sampled before)
   * @param seen token counts in prompt+output (repetition penalty) and in output only (presence/frequency)
   * @param banned token ids that must not be sampled now (EOS before min_tokens)
   * @param mask constrained decoding: only ids whose bit is set may be sampled (bit t & 31 of word t >> 5)
   * @param forced teacher forcing: this token is taken instead of a sampled one (its logprob reported)
   */
  sample(
    logits: Float32Array,
    offset: number,
    p: ResolvedSamplingParams,
    counter: number,
    seen: { all: Map<number, number>; output: Map<number, number> },
    banned: readonly number[] = [],
    mask?: Int32Array,
    forced?: number,
  ): SampledToken {
    const row = this.row;
    row.set(logits.subarray(offset, offset + this.limit));
    if (p.repetitionPenalty !== 1) {
      for (const t of seen.all.keys()) if (t < this.limit) row[t] = row[t] > 0 ? row[t] / p.repetitionPenalty : row[t] * p.repetitionPenalty;
    }
    if (p.presencePenalty !== 0 || p.frequencyPenalty !== 0) {
      for (const [t, c] of seen.output) if (t < this.limit) row[t] -= p.presencePenalty + p.frequencyPenalty * c;
    }
    for (const [t, b] of p.logitBias) if (t < this.limit) row[t] += b;
    for (const t of banned) if (t < this.limit) row[t] = -Infinity;
    if (mask) for (let t = 0; t < this.limit; t++) if (!((mask[t >>> 5] >>> (t & 31)) & 1)) row[t] = -Infinity;
    const u = uniformFromSeed(p.seed, counter);
    // A masked row samples over its allowed ids alone (core's sampleRowMasked, as op sample does);
    // bans and biases above already sit in `row`.
    const token = forced ?? (mask ? sampleRowMasked(row, 0, this.limit, mask, 0, p, u, this.scratch) : sampleRow(row, 0, this.limit, p, u, this.scratch));
    if (!p.logprobs) return { token };
    // Logprobs of the processed distribution before temperature (what OpenAI reports).
    let max = -Infinity;
    for (let i = 0; i < this.limit; i++) if (row[i] > max) max = row[i];
    let sum = 0;
    for (let i = 0; i < this.limit; i++) sum += Math.exp(row[i] - max);
    const lse = max + Math.log(sum);
    const out: SampledToken = { token, logprob: row[token] - lse };
    if (p.topLogprobs > 0) {
      const top: TokenLogprob[] = [];
      for (let i = 0; i < this.limit; i++) {
        const lp = row[i] - lse;
        // Masked and banned ids are no alternatives.
        if (lp === -Infinity) continue;
        if (top.length < p.topLogprobs || lp > top[top.length - 1].logprob) {
          top.push({ token: i, logprob: lp });
          top.sort((a, b) => b.logprob - a.logprob || a.token - b.token);
          if (top.length > p.topLogprobs) top.pop();
        }
      }
      out.topLogprobs = top;
    }
    return out;
  }
}
