import { Engine } from '@nerva/engine';
import { syntheticPrompt } from '../measure.js';

export interface GenerateProbeOptions {
  model: string;
  backend: 'cpu' | 'cuda' | 'auto';
  promptLen: number;
  newTokens: number;
}

/** Single-stream generation: throughput, per-token latency and hot-path allocations. */
export async function generateProbe(o: GenerateProbeOptions): Promise<Record<string, unknown>> {
  const engine = await Engine.create({ model: o.model, backend: o.backend });
  try {
    const prompt = syntheticPrompt(o.promptLen, engine.spec.vocabSize);
    // Warm-up request so first-touch costs do not land in the figures.
    await engine.submit(prompt.slice(0, 8), { maxTokens: 4, temperature: 0, ignoreEos: true }).done;
    const t0 = performance.now();
    const out = await engine.submit(prompt, { maxTokens: o.newTokens, temperature: 0, ignoreEos: true }).done;
    const wall = performance.now() - t0;
    const s = out.ledger.summary();
    return {
      probe: 'generate',
      model: o.model,
      backend: engine.backend.name,
      prompt_len: o.promptLen,
      new_tokens: out.tokenIds.length,
      tokens_per_s: Math.round((out.tokenIds.length / (wall / 1000)) * 100) / 100,
      decode_tokens_per_s: s.decode_tokens_per_s,
      ms_per_token_p50: s.ms_per_token_p50,
      ms_per_token_p99: s.ms_per_token_p99,
      hot_path_allocations: s.hot_path_allocations,
      graph_replays_per_token: s.graph_replays_per_decode_token,
      syncs_per_token: s.syncs_per_decode_token,
      notes: s.notes,
    };
  } finally {
    engine.dispose();
  }
}
