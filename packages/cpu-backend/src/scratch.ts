/**
 * Per-backend scratch memory for op kernels. Sized at construction for typical models and grown
 * (rarely, and only when a larger shape first appears) so that steady-state decode allocates
 * nothing on the JS heap.
 */
export interface ScratchSizes {
  /** Vocabulary size the sampler scratch is sized for. */
  vocab: number;
  /** Context length the attention score scratch is sized for. */
  context: number;
  /** Widest hidden/intermediate vector of the MoE and norm kernels. */
  width: number;
}

export const DEFAULT_SCRATCH: ScratchSizes = { vocab: 262144, context: 8192, width: 16384 };

export class Scratch {
  /** Reused object (not rebuilt per call) so sampling allocates nothing. */
  private readonly samplerScratch: { idx: Int32Array; prob: Float64Array };
  scores: Float64Array;
  vecA: Float64Array;
  vecB: Float64Array;
  flags: Uint8Array;
  private rowsF32: Float32Array;

  constructor(sizes: ScratchSizes = DEFAULT_SCRATCH) {
    this.samplerScratch = { idx: new Int32Array(sizes.vocab), prob: new Float64Array(sizes.vocab) };
    this.scores = new Float64Array(sizes.context);
    this.vecA = new Float64Array(sizes.width);
    this.vecB = new Float64Array(sizes.width);
    this.flags = new Uint8Array(sizes.width);
    this.rowsF32 = new Float32Array(sizes.width * 8);
  }

  /** A float32 scratch of at least `n` entries (normalized input rows of fused_matmul). */
  f32(n: number): Float32Array {
    if (this.rowsF32.length < n) this.rowsF32 = new Float32Array(n);
    return this.rowsF32;
  }

  /** Sampler scratch of at least `n` entries. */
  sampler(n: number): { idx: Int32Array; prob: Float64Array } {
    const s = this.samplerScratch;
    if (s.idx.length < n) {
      s.idx = new Int32Array(n);
      s.prob = new Float64Array(n);
    }
    return s;
  }

  scoreBuf(n: number): Float64Array {
    if (this.scores.length < n) this.scores = new Float64Array(Math.max(n, 2 * this.scores.length));
    return this.scores;
  }

  a(n: number): Float64Array {
    if (this.vecA.length < n) this.vecA = new Float64Array(n);
    return this.vecA;
  }

  b(n: number): Float64Array {
    if (this.vecB.length < n) this.vecB = new Float64Array(n);
    return this.vecB;
  }

  flagBuf(n: number): Uint8Array {
    if (this.flags.length < n) this.flags = new Uint8Array(n);
    return this.flags;
  }
}
