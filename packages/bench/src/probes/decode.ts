import { createHash } from 'node:crypto';
import { resolve } from 'node:path';
import { Engine, type BackendChoice, type EngineOptions } from '@nerva/engine';
import { kvReportJson } from '@nerva/server';
import { measureCopyBandwidth, syntheticPrompt, withScratchBackend } from '../measure.js';

/** The engine options the probe hands to Engine.create (each as EngineOptions documents it). */
type DecodeEngineOptions = Pick<
  EngineOptions,
  | 'numerics'
  | 'matmulPrecision'
  | 'batchInvariant'
  | 'kvCacheDtype'
  | 'vramBudget'
  | 'hostBudget'
  | 'offloadDir'
  | 'kvVramBudget'
  | 'kvHostBudget'
  | 'kvOffloadDir'
  | 'pipelineParallel'
  | 'stageVramBudgets'
  | 'pipelineMicroBatches'
  | 'tensorParallel'
  | 'allowSingleDeviceStages'
  | 'runAhead'
  | 'runAheadSteps'
>;

export interface DecodeProbeOptions extends DecodeEngineOptions {
  model: string;
  backend: BackendChoice;
  promptLen: number;
  newTokens: number;
  /** Time buckets per token (engine option profile; disables graphs). */
  profile?: boolean;
}

/**
 * Batch-1 decode against the memory roofline: the weight bytes a decode step reads (every weight
 * but an untied embedding table, of which it gathers a row) over the copy bandwidth measured in
 * the same run on the same backend.
 */
export async function decodeProbe(o: DecodeProbeOptions): Promise<Record<string, unknown>> {
  // Under a budget the engine's arenas have no room for the copy's scratch buffers: time it first.
  const budgeted = o.vramBudget !== undefined || o.hostBudget !== undefined;
  const scratchBw = budgeted ? await withScratchBackend(o.backend, (b) => measureCopyBandwidth(b), { numerics: o.numerics, matmulPrecision: o.matmulPrecision }) : undefined;
  const engine = await Engine.create({
    model: o.model,
    backend: o.backend,
    numerics: o.numerics,
    matmulPrecision: o.matmulPrecision,
    ...(o.batchInvariant !== undefined ? { batchInvariant: o.batchInvariant } : {}),
    kvCacheDtype: o.kvCacheDtype,
    maxNumSeqs: 8,
    maxModelLen: o.promptLen + o.newTokens + 16,
    profile: o.profile,
    vramBudget: o.vramBudget,
    hostBudget: o.hostBudget,
    offloadDir: o.offloadDir !== undefined ? resolve(o.offloadDir) : undefined,
    kvVramBudget: o.kvVramBudget,
    kvHostBudget: o.kvHostBudget,
    kvOffloadDir: o.kvOffloadDir !== undefined ? resolve(o.kvOffloadDir) : undefined,
    pipelineParallel: o.pipelineParallel,
    stageVramBudgets: o.stageVramBudgets,
    pipelineMicroBatches: o.pipelineMicroBatches,
    tensorParallel: o.tensorParallel,
    allowSingleDeviceStages: o.allowSingleDeviceStages,
    ...(o.runAhead !== undefined ? { runAhead: o.runAhead } : {}),
    ...(o.runAheadSteps !== undefined ? { runAheadSteps: o.runAheadSteps } : {}),
  });
  try {
    const bw = scratchBw ?? measureCopyBandwidth(engine.backend);
    const prompt = syntheticPrompt(o.promptLen, engine.spec.vocabSize);
    // Warm-up: a prompt of the same length (another seed: no prefix-cache hit) decoding long
    // enough to capture the decode graphs the measured run replays (the one-step graph and the
    // replay of runAheadSteps steps, for its context bucket): a first capture holds the device
    // for milliseconds, which a steady-state rate should not count.
    const warm = syntheticPrompt(o.promptLen, engine.spec.vocabSize, 7);
    await engine.submit(warm, { maxTokens: Math.min(o.newTokens, 4 * engine.runAheadSteps + 8), temperature: 0, ignoreEos: true }).done;
    const out = await engine.submit(prompt, { maxTokens: o.newTokens, temperature: 0, ignoreEos: true }).done;
    const s = out.ledger.summary();
    const roofline = bw / engine.model.decodeWeightBytes;
    const nodes = engine.graphNodes();
    const r: Record<string, unknown> = {
      probe: 'decode',
      model: o.model,
      backend: engine.backend.name,
      numerics: engine.backend.capabilities.numerics ?? 'exact',
      matmul_precision: engine.matmulPrecision,
      batch_invariant: engine.backend.capabilities.batchInvariant === true,
      kv_cache_dtype: engine.kvDtype,
      device: engine.backend.capabilities.deviceName,
      prompt_len: o.promptLen,
      // Stages, their layers and links (null: one stage).
      pipeline_parallel: engine.pipelineDescription()?.stages.length ?? 1,
      pipeline: engine.pipelineDescription() ?? null,
      tensor_parallel: engine.tensorParallelDescription()?.shards.length ?? 1,
      new_tokens: out.tokenIds.length,
      // Digest of the generated ids: two runs (other kernels, other machines) decoded the same tokens iff equal.
      tokens_sha256: createHash('sha256').update(out.tokenIds.join(',')).digest('hex').slice(0, 16),
      tokens_per_s: s.decode_tokens_per_s,
      ms_per_token_p50: s.ms_per_token_p50,
      ms_per_token_p99: s.ms_per_token_p99,
      // Device time between the step's events; the rest of a token's wall time is the host's turn.
      device_ms_per_token: s.device_active_ms_total !== undefined && s.tokens > 0 ? Math.round((s.device_active_ms_total / s.tokens) * 1000) / 1000 : null,
      weight_bytes: engine.weightBytes,
      // What the roofline divides by: the bytes a step reads.
      decode_weight_bytes: Math.round(engine.model.decodeWeightBytes),
      copy_bandwidth_gbs: Math.round(bw / 1e7) / 100,
      roofline_tok_s: Math.round(roofline * 100) / 100,
      fraction_of_roofline: Math.round((s.decode_tokens_per_s / roofline) * 1000) / 1000,
      // The one-row decode graph's nodes ("1s": the graph of steps within the backend's
      // shortContextKeys, "1" past it; the same kernels a token either way).
      graph_nodes_per_token: nodes['1'] ?? nodes['1s'] ?? null,
      decode_graphs: Object.keys(nodes).sort(),
      // Decode steps enqueued before the host has the previous step's tokens (EngineOptions.runAhead).
      run_ahead: engine.runAhead,
      // Steps one replay enqueued ahead may run (bounded by runAheadMs; decode_graphs "x<k>": replays of k steps).
      run_ahead_steps: engine.runAheadSteps,
      graph_replays_per_token: s.graph_replays_per_decode_token,
      hot_path_allocations: s.hot_path_allocations,
      syncs_per_token: s.syncs_per_decode_token,
      ttft_ms: out.times.firstToken !== undefined ? Math.round((out.times.firstToken - out.times.arrival) * 100) / 100 : null,
      notes: s.notes,
    };
    if (budgeted) {
      // Under a budget the weights may stream: the copy roofline above then bounds only the hot part.
      const m = engine.memoryReport();
      r.vram_budget_bytes = o.vramBudget ?? null;
      r.host_budget_bytes = o.hostBudget ?? null;
      r.memory_mode = m.mode;
      r.hot_bytes = m.weights.hotBytes;
      r.streamed_bytes_per_pass = m.streamedBytesPerPass;
      r.slots = m.weights.slots;
      r.notes = [...s.notes, ...m.notes.filter((n) => !s.notes.includes(n))];
    }
    if (o.kvVramBudget !== undefined) {
      // Tiered KV: the budgets and the pages by tier after the run (moves, merged passes).
      const m = engine.memoryReport();
      r.kv_vram_budget_bytes = o.kvVramBudget;
      r.kv_host_budget_bytes = o.kvHostBudget ?? null;
      r.kv_offload_dir = o.kvOffloadDir !== undefined ? resolve(o.kvOffloadDir) : null;
      r.kv = m.kv ? kvReportJson(m.kv) : null;
    }
    if (s.buckets_ms) r.buckets_ms_per_token = Object.fromEntries(Object.entries(s.buckets_ms).map(([k, v]) => [k, Math.round((v / Math.max(1, s.tokens)) * 1000) / 1000]));
    return r;
  } finally {
    engine.dispose();
  }
}
