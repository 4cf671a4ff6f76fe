import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { Engine, type BackendChoice } from '@nerva/engine';
import { convertToGguf, type GgufConvertType } from '@nerva/models';

export interface QuantErrorProbeOptions {
  /** A Hugging Face model folder with a tokenizer: the original model. */
  model: string;
  /** A UTF-8 text file: its first `tokens` tokens are scored. */
  text: string;
  /** Tokens of the text to score (default 2048). */
  tokens?: number;
  /**
   * Tokens a window: the text is cut into windows scored independently from their first token
   * (default: the model's max_position_embeddings, at most `tokens`).
   */
  window?: number;
  /** GGUF types to convert the model to and score (default F16, Q8_0, Q4_0, Q4_K, Q6_K, Q4_K_M). */
  types?: GgufConvertType[];
  backend?: BackendChoice;
  /** Windows scored at once (default 8). */
  maxNumSeqs?: number;
  /** Called with each type's line as soon as it is measured. */
  onLine?: (line: Record<string, unknown>) => void;
}

export const QUANT_ERROR_TYPES: readonly GgufConvertType[] = ['F16', 'Q8_0', 'Q4_0', 'Q4_K', 'Q6_K', 'Q4_K_M'];
/** Bytes of the original model's logits the probe holds at once (tokens x vocab x 4). */
const MAX_HELD_LOGIT_BYTES = 2 ** 31;

/** Log-softmax of `x` in float64. */
export function logSoftmax(x: Float32Array): Float64Array {
  let m = -Infinity;
  for (const v of x) m = Math.max(m, v);
  let s = 0;
  for (const v of x) s += Math.exp(v - m);
  const lse = m + Math.log(s);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] - lse;
  return out;
}

const argmax = (x: ArrayLike<number>): number => {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
};

/** Running comparison of a quantized model's next-token distributions with the original's. */
export class QuantErrorStats {
  private n = 0;
  private nllP = 0;
  private nllQ = 0;
  private kl = 0;
  private klMax = 0;
  private agree = 0;

  /** One scored position: the original's logits `p`, the quantized model's `q`, the true next token. */
  add(p: Float32Array, q: Float32Array, next: number): void {
    if (p.length !== q.length) throw new RangeError(`logits of ${p.length} and ${q.length} entries`);
    const lp = logSoftmax(p);
    const lq = logSoftmax(q);
    // KL(P || Q) = sum_i p_i (log p_i - log q_i), in float64.
    let kl = 0;
    for (let i = 0; i < lp.length; i++) {
      const pi = Math.exp(lp[i]);
      if (pi > 0) kl += pi * (lp[i] - lq[i]);
    }
    this.n++;
    this.kl += kl;
    this.klMax = Math.max(this.klMax, kl);
    this.nllP -= lp[next];
    this.nllQ -= lq[next];
    if (argmax(p) === argmax(q)) this.agree++;
  }

  /** Perplexities, their difference, mean and largest KL(original || quantized), top-1 agreement. */
  summary(): { positions: number; ppl_original: number; ppl: number; ppl_delta: number; ppl_delta_rel: number; kl_mean: number; kl_max: number; top1_agreement: number } {
    const pplP = Math.exp(this.nllP / this.n);
    const pplQ = Math.exp(this.nllQ / this.n);
    return {
      positions: this.n,
      ppl_original: pplP,
      ppl: pplQ,
      ppl_delta: pplQ - pplP,
      ppl_delta_rel: (pplQ - pplP) / pplP,
      kl_mean: this.kl / this.n,
      kl_max: this.klMax,
      top1_agreement: this.agree / this.n,
    };
  }
}

/**
 * The logits predicting tokens 1.. of every window, teacher-forced: each window is its first token
 * as the prompt and the rest forced, up to `maxNumSeqs` windows at once. Calls `each` per window
 * in order with its logits.
 */
async function scoreWindows(engine: Engine, windows: number[][], maxNumSeqs: number, each: (w: number, logits: Float32Array[]) => void): Promise<void> {
  for (let at = 0; at < windows.length; at += maxNumSeqs) {
    const batch = windows.slice(at, at + maxNumSeqs);
    const outs = await Promise.all(
      batch.map((w) => engine.submit(w.slice(0, 1), { temperature: 0, maxTokens: w.length - 1, ignoreEos: true, forceTokens: w.slice(1), returnStepLogits: true }).done),
    );
    outs.forEach((o, i) => each(at + i, o.stepLogits!));
  }
}

/**
 * The quantization's own error: the original model and each GGUF type converted from it score the
 * same teacher-forced text; per type, perplexity against the original's, mean KL(original ||
 * quantized) over the next-token distributions and top-1 agreement. Quantized runs are not exact
 * with respect to the original model (`exact: false`); this measures by how much.
 */
export async function quantErrorProbe(o: QuantErrorProbeOptions): Promise<Record<string, unknown>[]> {
  const backend = o.backend ?? 'cpu';
  const maxNumSeqs = o.maxNumSeqs ?? 8;
  const types = o.types ?? [...QUANT_ERROR_TYPES];
  const want = o.tokens ?? 2048;
  if (!(Number.isInteger(want) && want >= 2)) throw new RangeError(`tokens must be an integer of at least 2, got ${want}`);
  const text = await readFile(o.text, 'utf8');
  const original = await Engine.create({ model: o.model, backend, maxNumSeqs });
  let windows: number[][];
  let window: number;
  const held: Float32Array[][] = [];
  let origNumerics: string;
  try {
    const ids = original.encode(text).slice(0, want);
    if (ids.length < 2) throw new RangeError(`${o.text}: fewer than 2 tokens of text`);
    window = o.window ?? Math.min(original.spec.maxPositionEmbeddings, ids.length);
    if (!(Number.isInteger(window) && window >= 2 && window <= original.spec.maxPositionEmbeddings)) {
      throw new RangeError(`window must be an integer from 2 to the model's ${original.spec.maxPositionEmbeddings} positions, got ${window}`);
    }
    windows = [];
    for (let i = 0; i + 1 < ids.length; i += window) windows.push(ids.slice(i, i + window));
    if (windows[windows.length - 1].length < 2) windows.pop();
    const bytes = ids.length * original.spec.vocabSize * 4;
    if (bytes > MAX_HELD_LOGIT_BYTES) throw new RangeError(`${ids.length} tokens x ${original.spec.vocabSize} logits hold ${bytes} bytes; score fewer tokens`);
    await scoreWindows(original, windows, maxNumSeqs, (w, l) => (held[w] = l));
    origNumerics = original.backend.capabilities.numerics ?? 'exact';
  } finally {
    original.dispose();
  }

  const dir = await mkdtemp(join(tmpdir(), 'nerva-quant-error-'));
  const lines: Record<string, unknown>[] = [];
  try {
    for (const type of types) {
      const file = join(dir, `${type}.gguf`);
      const conv = await convertToGguf({ source: o.model, out: file, type });
      const engine = await Engine.create({ model: file, backend, maxNumSeqs });
      const stats = new QuantErrorStats();
      let format: unknown;
      const backendName = engine.backend.name;
      try {
        await scoreWindows(engine, windows, maxNumSeqs, (w, l) => {
          for (let k = 0; k < l.length; k++) stats.add(held[w][k], l[k], windows[w][k + 1]);
        });
        format = engine.memoryReport().weights.format;
      } finally {
        engine.dispose();
        await rm(file, { force: true });
      }
      const line = {
        probe: 'quant-error',
        model: basename(o.model),
        text: basename(o.text),
        backend: backendName,
        numerics: origNumerics,
        type,
        file_bytes: conv.bytes,
        windows: windows.length,
        window,
        ...stats.summary(),
        weights: format,
      };
      lines.push(line);
      o.onLine?.(line);
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
  return lines;
}
