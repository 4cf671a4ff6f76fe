import type { DeviceBackend } from '@nerva/core';
import { type ImportanceCache, ImportanceMeter } from '@nerva/memos';
import type { ModelSpec } from '@nerva/models';
import type { ModelRunner } from './model-runner.js';

/**
 * Measure the per-layer importance profile (how much each layer changes the residual stream)
 * while `run` computes one calibration prompt of `tokens` ids on `runner`, and save it under
 * `key`; the next start's memory plan keeps the most important layers hot. Returns the note
 * to record.
 */
export async function calibrateImportance(
  runner: ModelRunner,
  backend: DeviceBackend,
  s: ModelSpec,
  tokens: number,
  cache: ImportanceCache,
  key: string,
  run: (ids: number[]) => Promise<unknown>,
): Promise<string> {
  const ids = Array.from({ length: tokens }, (_, i) => (i * 7919 + 13) % s.vocabSize);
  const meter = new ImportanceMeter(s.numLayers);
  const H = s.hiddenSize;
  let prev: Float32Array | undefined;
  // The probe runs before each layer of a per-layer pass, where the residual stream is complete.
  runner.layerProbe = (l: number, rows: number) => {
    const cur = backend.read(runner.hidden, 0, rows * H) as Float32Array;
    if (prev !== undefined) meter.add(l - 1, prev, cur, rows, H);
    prev = cur;
  };
  try {
    await run(ids);
  } finally {
    runner.layerProbe = undefined;
  }
  const file = cache.save({ version: 1, key, layers: meter.scores(), tokens, method: 'mean relative residual update per layer' });
  return `importance profile: calibrated on ${tokens} tokens, saved to ${file} (used by the next start's plan)`;
}
