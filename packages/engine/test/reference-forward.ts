import { join } from 'node:path';
import { layerWindow, loadModelConfig, type ModelSpec, ropeInvFreq, SafetensorsFile } from '@nerva/models';

/**
 * A straightforward float64 forward pass of a dense decoder (llama / qwen2 / qwen3 layouts, one
 * `model.safetensors`), written from the transformers modeling code with nothing shared with the
 * engine: each call recomputes the whole sequence, with no KV cache and no paging. Sliding layers
 * mask a query at position p to keys k with p - k < window (transformers' sliding_window_overlay).
 * Used to check the engine's sliding-window attention against an independent computation.
 */
export class ReferenceModel {
  private constructor(
    readonly spec: ModelSpec,
    private readonly w: Map<string, Float64Array>,
    private readonly invFreq: Float64Array,
  ) {}

  static async load(dir: string): Promise<ReferenceModel> {
    const spec = await loadModelConfig(dir);
    if (spec.moe) throw new Error('ReferenceModel covers dense models only');
    const f = await SafetensorsFile.open(join(dir, 'model.safetensors'));
    const w = new Map<string, Float64Array>();
    try {
      for (const name of f.names()) w.set(name, Float64Array.from(await f.readF32(name)));
    } finally {
      await f.close();
    }
    return new ReferenceModel(spec, w, ropeInvFreq(spec));
  }

  /** Layer windows in force (overridable per call: 0 everywhere gives full attention). */
  windows(): number[] {
    return Array.from({ length: this.spec.numLayers }, (_, l) => layerWindow(this.spec, l));
  }

  private t(name: string): Float64Array {
    const x = this.w.get(name);
    if (!x) throw new Error(`reference: no tensor ${name}`);
    return x;
  }

  /**
   * Logits of the last position of `ids` (float64). kvBf16: keys (after norm and RoPE) and values
   * rounded to bf16 (round to nearest even), as a bf16 KV cache stores them.
   */
  lastLogits(ids: readonly number[], windows = this.windows(), opts: { kvBf16?: boolean } = {}): Float64Array {
    const s = this.spec;
    const H = s.hiddenSize;
    const hd = s.headDim;
    const nq = s.numHeads;
    const nkv = s.numKvHeads;
    const n = ids.length;
    const eps = s.rmsNormEps;
    let x: Float64Array[] = ids.map((id) => this.t('model.embed_tokens.weight').slice(id * H, (id + 1) * H));
    for (let l = 0; l < s.numLayers; l++) {
      const p = `model.layers.${l}.`;
      const win = windows[l];
      const h = x.map((r) => rmsnorm(r, this.t(p + 'input_layernorm.weight'), eps));
      const bias = (k: string) => (s.attentionBias ? this.w.get(p + `self_attn.${k}_proj.bias`) : undefined);
      const q = h.map((r) => linear(r, this.t(p + 'self_attn.q_proj.weight'), nq * hd, bias('q')));
      const k = h.map((r) => linear(r, this.t(p + 'self_attn.k_proj.weight'), nkv * hd, bias('k')));
      const v = h.map((r) => linear(r, this.t(p + 'self_attn.v_proj.weight'), nkv * hd, bias('v')));
      for (let i = 0; i < n; i++) {
        for (let hh = 0; hh < nq; hh++) this.headNormRope(q[i], hh * hd, s.qkNorm ? this.t(p + 'self_attn.q_norm.weight') : undefined, i);
        for (let hh = 0; hh < nkv; hh++) this.headNormRope(k[i], hh * hd, s.qkNorm ? this.t(p + 'self_attn.k_norm.weight') : undefined, i);
        if (opts.kvBf16) {
          k[i] = k[i].map(bf16Round);
          v[i] = v[i].map(bf16Round);
        }
      }
      const group = nq / nkv;
      const attn = x.map(() => new Float64Array(nq * hd));
      const scale = 1 / Math.sqrt(hd);
      for (let i = 0; i < n; i++) {
        const lo = win > 0 ? Math.max(0, i - win + 1) : 0;
        for (let hh = 0; hh < nq; hh++) {
          const kh = Math.floor(hh / group) * hd;
          const sc: number[] = [];
          for (let j = lo; j <= i; j++) {
            let d = 0;
            for (let c = 0; c < hd; c++) d += q[i][hh * hd + c] * k[j][kh + c];
            sc.push(d * scale);
          }
          const m = Math.max(...sc);
          const e = sc.map((z) => Math.exp(z - m));
          const sum = e.reduce((a, b) => a + b, 0);
          for (let j = lo; j <= i; j++) {
            const wgt = e[j - lo] / sum;
            for (let c = 0; c < hd; c++) attn[i][hh * hd + c] += wgt * v[j][kh + c];
          }
        }
      }
      const oBias = s.oProjBias ? this.w.get(p + 'self_attn.o_proj.bias') : undefined;
      x = x.map((r, i) => add(r, linear(attn[i], this.t(p + 'self_attn.o_proj.weight'), H, oBias)));
      const I = s.intermediateSize;
      x = x.map((r) => {
        const hn = rmsnorm(r, this.t(p + 'post_attention_layernorm.weight'), eps);
        const g = linear(hn, this.t(p + 'mlp.gate_proj.weight'), I);
        const u = linear(hn, this.t(p + 'mlp.up_proj.weight'), I);
        for (let c = 0; c < I; c++) g[c] = (g[c] / (1 + Math.exp(-g[c]))) * u[c];
        return add(r, linear(g, this.t(p + 'mlp.down_proj.weight'), H));
      });
    }
    const last = rmsnorm(x[n - 1], this.t('model.norm.weight'), eps);
    const head = s.tieWordEmbeddings ? this.t('model.embed_tokens.weight') : this.t('lm_head.weight');
    return linear(last, head, s.vocabSize);
  }

  /** Greedy generation (recomputing the sequence each step); tokens and the logits before each. */
  greedy(prompt: readonly number[], steps: number, windows = this.windows()): { tokens: number[]; logits: Float64Array[] } {
    const ids = [...prompt];
    const tokens: number[] = [];
    const logits: Float64Array[] = [];
    for (let i = 0; i < steps; i++) {
      const lg = this.lastLogits(ids, windows);
      let best = 0;
      for (let j = 1; j < lg.length; j++) if (lg[j] > lg[best]) best = j;
      logits.push(lg);
      tokens.push(best);
      ids.push(best);
    }
    return { tokens, logits };
  }

  /** Per-head RMSNorm (Qwen3) then RoPE (rotate_half layout) of one head at `off`, position `pos`. */
  private headNormRope(x: Float64Array, off: number, norm: Float64Array | undefined, pos: number): void {
    const hd = this.spec.headDim;
    if (norm) {
      let ss = 0;
      for (let c = 0; c < hd; c++) ss += x[off + c] * x[off + c];
      const r = 1 / Math.sqrt(ss / hd + this.spec.rmsNormEps);
      for (let c = 0; c < hd; c++) x[off + c] = x[off + c] * r * norm[c];
    }
    const half = hd / 2;
    for (let c = 0; c < half; c++) {
      const a = pos * this.invFreq[c];
      const cos = Math.cos(a);
      const sin = Math.sin(a);
      const x1 = x[off + c];
      const x2 = x[off + c + half];
      x[off + c] = x1 * cos - x2 * sin;
      x[off + c + half] = x2 * cos + x1 * sin;
    }
  }
}

/** x rounded to float32, then to bf16 (nearest, ties to even). */
function bf16Round(x: number): number {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer);
  u[0] = ((u[0] + 0x7fff + ((u[0] >>> 16) & 1)) >>> 16) << 16;
  return f[0];
}

function rmsnorm(x: Float64Array, w: Float64Array, eps: number): Float64Array {
  let ss = 0;
  for (const v of x) ss += v * v;
  const r = 1 / Math.sqrt(ss / x.length + eps);
  return x.map((v, i) => v * r * w[i]);
}

/** y = W x (+ b) with W [out, in] row-major (nn.Linear). */
function linear(x: Float64Array, w: Float64Array, out: number, b?: Float64Array): Float64Array {
  const n = x.length;
  const y = new Float64Array(out);
  for (let o = 0; o < out; o++) {
    let acc = b ? b[o] : 0;
    const base = o * n;
    for (let i = 0; i < n; i++) acc += w[base + i] * x[i];
    y[o] = acc;
  }
  return y;
}

function add(a: Float64Array, b: Float64Array): Float64Array {
  return a.map((v, i) => v + b[i]);
}
