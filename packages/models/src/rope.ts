import type { ModelSpec } from './config.js';

/**
 * Rotary inverse frequencies, length headDim / 2: `theta^(-2i/d)`, rescaled per the spec's
 * `ropeScaling`. Computed in float64; backends round to their own precision.
 *
 * - `linear`: every frequency divided by `factor` (equivalent to dividing positions).
 * - `llama3`: as HF transformers `_compute_llama3_parameters`: wavelengths longer than
 *   `original / lowFreqFactor` are divided by `factor`, shorter than `original / highFreqFactor`
 *   are kept, and those in between interpolate smoothly between the two.
 */
export function ropeInvFreq(spec: Pick<ModelSpec, 'headDim' | 'ropeTheta' | 'ropeScaling'>): Float64Array {
  const d = spec.headDim;
  const out = new Float64Array(d / 2);
  for (let i = 0; i < out.length; i++) out[i] = 1 / Math.pow(spec.ropeTheta, (2 * i) / d);
  const s = spec.ropeScaling;
  if (s.type === 'linear') {
    for (let i = 0; i < out.length; i++) out[i] /= s.factor;
  } else if (s.type === 'llama3') {
    const lowFreqWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor;
    const highFreqWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor;
    for (let i = 0; i < out.length; i++) {
      const f = out[i];
      const wavelen = (2 * Math.PI) / f;
      if (wavelen > lowFreqWavelen) {
        out[i] = f / s.factor;
      } else if (wavelen >= highFreqWavelen) {
        const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
        out[i] = (1 - smooth) * (f / s.factor) + smooth * f;
      }
    }
  }
  return out;
}
