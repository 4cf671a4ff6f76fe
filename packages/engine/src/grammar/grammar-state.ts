import type { XGrammarRuntime, XgHandle, XgMatcher } from './xgrammar-runtime.js';

/**
 * One constrained request's place in its grammar and the token mask of its next step: bit
 * (t & 31) of `mask[t >> 5]` is set where token t may come next.
 *
 * The step loop drives it in two halves so the mask can be computed off its critical path:
 * `submit` hands over the sampled token as soon as it is known (where the matcher runs on a
 * worker thread, the next mask is computed there meanwhile), `ready` waits for that mask right
 * before the sampling that reads it. `advance` is both at once.
 */
export interface GrammarState {
  /** The next token's mask; complete once `ready` returned (or after `advance`). */
  readonly mask: Int32Array;
  /** True once a stop token was accepted: the output is complete. */
  readonly terminated: boolean;
  /**
   * Host time on the step's critical path for the last mask (ms, the token ledger's grammarMs):
   * in thread, accepting the token and computing the next mask; on a worker, the time `ready`
   * waited for it (0 when the worker finished while the device ran the step).
   */
  lastMs: number;
  /** Whether token `t` may come next (reads the current mask). */
  allows(t: number): boolean;
  /**
   * Take the sampled token and start computing the next mask. False (nothing changed) when the
   * grammar does not allow the token; throws when the grammar engine failed.
   */
  submit(token: number): boolean;
  /** Wait for the mask started by the last `submit`; throws when the grammar engine failed. */
  ready(): void;
  /** `submit`, then `ready`. */
  advance(token: number): boolean;
  /** Free the matcher (the request ended). */
  dispose(): void;
}

/** Whether bit t of `mask` is set (t within `vocabSize`). */
export function maskAllows(mask: Int32Array, vocabSize: number, t: number): boolean {
  return t >= 0 && t < vocabSize && ((mask[t >>> 5] >>> (t & 31)) & 1) === 1;
}

/**
 * A grammar state whose XGrammar matcher runs on the calling thread: `submit` accepts the token
 * and computes the next mask before it returns (what a grammar worker runs, and the step loop's
 * own path where no worker runs).
 */
export class InThreadGrammarState implements GrammarState {
  readonly mask: Int32Array;
  lastMs = 0;
  private readonly matcher: XgMatcher;
  private done = false;
  private carryMs = 0;

  /**
   * @param compiled a grammar compiled by `rt` for a vocabulary of `vocabSize` ids
   * @param stopTokenIds the tokens that end the output where the grammar accepts (EOS, the request's stop ids)
   * @param mask where the masks are written (a worker's shared buffer); default a buffer of its own
   */
  constructor(
    private readonly rt: XGrammarRuntime,
    compiled: XgHandle,
    stopTokenIds: readonly number[],
    private readonly vocabSize: number,
    mask?: Int32Array,
  ) {
    const words = Math.ceil(vocabSize / 32);
    if (mask && mask.length !== words) throw new RangeError(`a mask of ${vocabSize} ids has ${words} words, got ${mask.length}`);
    this.mask = mask ?? new Int32Array(words);
    const t0 = performance.now();
    this.matcher = rt.call('creating the grammar matcher', () => {
      const b = rt.binding;
      const stops = b.vecIntFromJSArray([...stopTokenIds]);
      try {
        return new b.GrammarMatcher(compiled, stops, false, -1);
      } finally {
        stops.delete();
      }
    });
    this.fill();
    // Starting the matcher (and the first mask) is the first token's grammar time.
    this.carryMs = performance.now() - t0;
  }

  get terminated(): boolean {
    return this.done;
  }

  allows(t: number): boolean {
    return maskAllows(this.mask, this.vocabSize, t);
  }

  submit(token: number): boolean {
    const t0 = performance.now();
    if (this.done || !this.allows(token)) return false;
    const ok = this.rt.call('accepting a token', () => this.matcher.AcceptToken(token, false));
    if (!ok) return false;
    this.done = this.rt.call('reading the grammar state', () => this.matcher.IsTerminated());
    if (!this.done) this.fill();
    this.lastMs = performance.now() - t0 + this.carryMs;
    this.carryMs = 0;
    return true;
  }

  ready(): void {}

  advance(token: number): boolean {
    return this.submit(token);
  }

  dispose(): void {
    if (!this.rt.dead) this.matcher.delete();
  }

  private fill(): void {
    this.rt.call('computing the token mask', () => {
      const v = this.matcher.GetNextTokenBitmask(this.vocabSize);
      try {
        this.mask.set(this.rt.binding.vecIntToView(v).subarray(0, this.mask.length));
      } finally {
        v.delete();
      }
    });
  }
}
