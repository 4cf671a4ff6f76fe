// GPU machine: the engine's stage pipeline on CUDA against one stage.
//   pipeline.mjs single <dir> [<dir> ...]   N stages on ONE GPU (allowSingleDeviceStages: device-copy
//                                           links, one captured graph per decode step) -> $OUT/pipeline.json
//   pipeline.mjs multi <dir> [<dir> ...]    a stage per GPU (stageDevices, default 0,1: one CudaBackend
//                                           per GPU, NCCL links, micro-batches) -> $OUT/pipeline-multi.json
// A <dir> is a model folder, or a folder of model folders (every subfolder with a config.json).
// For each model: greedy tokens of one stage and of the pipeline (batch 1, then 4 concurrent
// requests), the first-position logits compared bit for bit, and decode tok/s of both at batch 1
// (a warm-up request first, so both replay captured graphs), from which the pipeline's overhead per
// token follows. Environment: NERVA_PIPELINE_STAGES (single: stage counts, default "2"; counts
// above a model's layer count are skipped), NERVA_PIPELINE_DEVICES (multi: default "0,1"),
// NERVA_PIPELINE_TOKENS (decode tokens timed, default 128), NERVA_PIPELINE_PROMPT (prompt length,
// default 32), NERVA_PIPELINE_BACKEND (default cuda; cpu runs the same comparison on the CPU
// backend, a dry run of this script), NERVA_PIPELINE_BUDGET (multi: a size, e.g. 10GiB: the
// stages run under that VRAM budget each, all resident, and one GPU under the same budget runs
// as a variant too, with the memory OS streaming what does not fit; each run reports its memory:
// mode and per-stage residency, and the ledger's per-stage and handoff times). Exits non-zero when
// a pipeline's tokens differ from one stage's.
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Engine, type EngineOptions } from '@nerva/engine';
import { parseSize } from '@nerva/server';

const out = process.env.OUT ?? '.';
const [mode, ...dirs] = process.argv.slice(2);
const newTokens = Number(process.env.NERVA_PIPELINE_TOKENS ?? 128);
const promptLen = Number(process.env.NERVA_PIPELINE_PROMPT ?? 32);
const backend = (process.env.NERVA_PIPELINE_BACKEND ?? 'cuda') as 'cuda' | 'cpu';

function modelDirs(list: string[]): string[] {
  const found: string[] = [];
  for (const d of list) {
    if (existsSync(path.join(d, 'config.json'))) found.push(d);
    else if (existsSync(d)) for (const s of readdirSync(d).sort()) if (existsSync(path.join(d, s, 'config.json'))) found.push(path.join(d, s));
  }
  return found;
}

/** Prompt ids every model's vocabulary holds (the fixtures have 512+). */
const prompt = (n: number, vocab: number) => Array.from({ length: n }, (_, i) => (i * 37 + 11) % Math.min(vocab, 500));

interface Run {
  tokens: number[];
  batch: number[][];
  logits: Float32Array;
  decodeTokS: number;
  deviceMsPerToken: number | null;
  graphNodes: Record<number, number>;
  graphReplaysPerToken: number;
  hotPathAllocations: number;
  syncsPerToken: unknown;
  pipeline: unknown;
  memory: { mode: string; devices: unknown };
  stageMsPerToken: number[] | null;
  linkMsPerToken: number[] | null;
  notes: string[];
}

async function measure(model: string, extra: Partial<EngineOptions>): Promise<Run> {
  const engine = await Engine.create({ model, backend, maxNumSeqs: 8, maxModelLen: promptLen + newTokens + 64, ...extra });
  try {
    const ids = prompt(promptLen, engine.spec.vocabSize);
    // Warm-up: captures the batch-1 decode graph.
    await engine.submit(ids.slice(0, 8), { temperature: 0, maxTokens: 8, ignoreEos: true }).done;
    const first = await engine.submit(ids, { temperature: 0, maxTokens: 1, ignoreEos: true, returnPromptLogits: true }).done;
    const o = await engine.submit(ids, { temperature: 0, maxTokens: newTokens, ignoreEos: true }).done;
    const s = o.ledger.summary();
    const batch = await Promise.all(
      [0, 1, 2, 3].map((k) => engine.submit(ids.slice(k, promptLen - k), { temperature: 0, maxTokens: 24, ignoreEos: true }).done.then((x) => x.tokenIds)),
    );
    return {
      tokens: o.tokenIds,
      batch,
      logits: first.promptLogits!,
      decodeTokS: s.decode_tokens_per_s,
      deviceMsPerToken: s.device_active_ms_total !== undefined && s.tokens > 0 ? s.device_active_ms_total / s.tokens : null,
      graphNodes: engine.graphNodes(),
      graphReplaysPerToken: s.graph_replays_per_decode_token,
      hotPathAllocations: s.hot_path_allocations,
      syncsPerToken: s.syncs_per_decode_token,
      pipeline: engine.pipelineDescription() ?? null,
      memory: (({ mode, devices }) => ({ mode, devices: devices ?? null }))(engine.memoryReport()),
      stageMsPerToken: s.stage_ms_total && s.tokens > 0 ? s.stage_ms_total.map((x) => r3(x / s.tokens)) : null,
      linkMsPerToken: s.link_ms_total && s.tokens > 0 ? s.link_ms_total.map((x) => r3(x / s.tokens)) : null,
      notes: s.notes,
    };
  } finally {
    engine.dispose();
  }
}

const firstDiff = (a: readonly number[], b: readonly number[]) => {
  const n = Math.max(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return -1;
};
const r3 = (x: number) => Math.round(x * 1000) / 1000;

async function compare(models: string[], variants: { label: string; opts: Partial<EngineOptions>; stages: number }[], file: string): Promise<void> {
  const results: Record<string, unknown>[] = [];
  let ok = true;
  for (const model of models) {
    const name = path.basename(model);
    let one: Run;
    try {
      one = await measure(model, {});
    } catch (e) {
      ok = false;
      results.push({ model: name, error: `one stage: ${(e as Error).message}` });
      console.log(`${name}: one stage FAILED: ${(e as Error).message}`);
      continue;
    }
    for (const v of variants) {
      let p: Run;
      try {
        p = await measure(model, v.opts);
      } catch (e) {
        const msg = (e as Error).message;
        // A stage count above the layer count is the engine's own refusal: skipped, not failed.
        const skipped = /exceeds the model's \d+ decoder layers/.test(msg);
        if (!skipped) ok = false;
        results.push({ model: name, variant: v.label, [skipped ? 'skipped' : 'error']: msg });
        console.log(`${name} ${v.label}: ${skipped ? 'skipped' : 'FAILED'}: ${msg}`);
        continue;
      }
      const tokenDiff = firstDiff(p.tokens, one.tokens);
      const batchDiff = p.batch.map((b, i) => firstDiff(b, one.batch[i]));
      let logitsMaxAbsDiff = 0;
      for (let i = 0; i < one.logits.length; i++) logitsMaxAbsDiff = Math.max(logitsMaxAbsDiff, Math.abs(p.logits[i] - one.logits[i]));
      const identical = tokenDiff < 0 && batchDiff.every((d) => d < 0);
      ok &&= identical;
      const msOne = 1000 / one.decodeTokS;
      const msPipe = 1000 / p.decodeTokS;
      const r = {
        model: name,
        variant: v.label,
        stages: v.stages,
        identical,
        first_divergence: tokenDiff,
        batch_first_divergence: batchDiff,
        logits_max_abs_diff: logitsMaxAbsDiff,
        tokens: one.tokens.length,
        one_stage: { decode_tok_s: one.decodeTokS, ms_per_token: r3(msOne), device_ms_per_token: one.deviceMsPerToken && r3(one.deviceMsPerToken), graph_nodes: one.graphNodes, graph_replays_per_token: one.graphReplaysPerToken },
        pipeline: {
          decode_tok_s: p.decodeTokS,
          ms_per_token: r3(msPipe),
          device_ms_per_token: p.deviceMsPerToken && r3(p.deviceMsPerToken),
          stage_ms_per_token: p.stageMsPerToken,
          link_ms_per_token: p.linkMsPerToken,
          graph_nodes: p.graphNodes,
          graph_replays_per_token: p.graphReplaysPerToken,
          hot_path_allocations: p.hotPathAllocations,
          syncs_per_token: p.syncsPerToken,
          layout: p.pipeline,
          memory: p.memory,
        },
        overhead_ms_per_token: r3(msPipe - msOne),
        overhead_fraction: r3(msPipe / msOne - 1),
        notes: p.notes,
      };
      results.push(r);
      console.log(
        `${name} ${v.label}: ${identical ? 'identical' : `DIVERGES (batch-1 at ${tokenDiff}, batched ${JSON.stringify(batchDiff)})`}, logits max |diff| ${logitsMaxAbsDiff}; ` +
          `${one.decodeTokS} -> ${p.decodeTokS} tok/s, overhead ${r.overhead_ms_per_token} ms/token (${(100 * r.overhead_fraction).toFixed(1)} %)`,
      );
    }
  }
  writeFileSync(path.join(out, file), JSON.stringify({ ok, mode, backend, new_tokens: newTokens, prompt_len: promptLen, results }, null, 1));
  if (!ok) process.exitCode = 1;
}

const models = modelDirs(dirs);
if (models.length === 0 || (mode !== 'single' && mode !== 'multi')) {
  console.error('usage: pipeline.mjs single|multi <model dir or folder of models> ...');
  process.exit(2);
}
if (mode === 'single') {
  const counts = (process.env.NERVA_PIPELINE_STAGES ?? '2').split(',').map(Number);
  await compare(
    models,
    counts.map((n) => ({ label: `${n} stages on one GPU`, stages: n, opts: { pipelineParallel: n, allowSingleDeviceStages: true } })),
    'pipeline.json',
  );
} else {
  // One CudaBackend per GPU, NCCL between them; eager passes, micro-batches (default: one per stage).
  const devices = (process.env.NERVA_PIPELINE_DEVICES ?? '0,1').split(',').map(Number);
  const mb = process.env.NERVA_PIPELINE_MICRO_BATCHES;
  const budget = process.env.NERVA_PIPELINE_BUDGET ? parseSize(process.env.NERVA_PIPELINE_BUDGET, 'NERVA_PIPELINE_BUDGET') : undefined;
  const under = budget !== undefined ? { vramBudget: budget } : {};
  await compare(
    models,
    [
      { label: `stages on GPUs ${devices.join(',')}${budget ? ` under ${process.env.NERVA_PIPELINE_BUDGET} each` : ''}`, stages: devices.length, opts: { stageDevices: devices, ...(mb ? { pipelineMicroBatches: Number(mb) } : {}), ...under } },
      // The same budget on one GPU: the memory OS streams what does not fit (the offload baseline).
      ...(budget !== undefined ? [{ label: `one GPU under ${process.env.NERVA_PIPELINE_BUDGET} (memory OS)`, stages: 1, opts: under }] : []),
    ],
    'pipeline-multi.json',
  );
}
