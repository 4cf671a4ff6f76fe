import { engineOption, type EngineOptions, type GenerateOptions } from '@nerva/engine';
import type { Command } from 'commander';
import { CLI_ENGINE_FLAGS, openCliEngine } from '../cli-engine.js';
import { memoryReportJson, tiersJson } from '../memory-report.js';
import { parseFloatArg, parseIdList, parseIntArg } from '../cli-util.js';
import { addFlags, deriveFlags } from '../options.js';

/** The prompt of `nerva run` without --prompt or --prompt-ids (the embedded model knows Shakespeare's speakers). */
export const DEFAULT_PROMPT = 'ROMEO:';

/** The engine options `nerva run` takes, by their EngineOptions names (defaults apply: no config file here). */
const ENGINE_FLAGS = deriveFlags(
  [
    ...CLI_ENGINE_FLAGS,
    ...(['kvVramBudget', 'kvHostBudget', 'kvOffloadDir', 'kvWarmLinkShare', 'pipelineParallel', 'pipelineMicroBatches', 'stageVramBudgets', 'tensorParallel', 'allowSingleDeviceStages', 'profile'] as const).map(engineOption),
  ],
  { applyDefaults: true },
);

/** The flags of `nerva run` that are not engine options. */
interface RunFlags {
  prompt?: string;
  promptIds?: number[];
  maxTokens: number;
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  seed?: number;
  json?: boolean;
}

export function registerRun(program: Command): void {
  const cmd = program
    .command('run')
    .description('generate text from a model (the embedded default model when --model is absent)')
    .option('--prompt <text>', `prompt text (default: "${DEFAULT_PROMPT}")`)
    .option('--prompt-ids <ids>', 'prompt as comma-separated token ids', parseIdList)
    .option('--max-tokens <n>', 'tokens to generate', parseIntArg('--max-tokens'), 128)
    .option('--temperature <t>', 'sampling temperature (0 = greedy); default from generation_config.json', parseFloatArg('--temperature'))
    .option('--top-k <k>', 'top-k (0 = off)', parseIntArg('--top-k'))
    .option('--top-p <p>', 'top-p', parseFloatArg('--top-p'))
    .option('--min-p <p>', 'min-p', parseFloatArg('--min-p'))
    .option('--seed <s>', 'seed for reproducible sampling', parseIntArg('--seed'));
  addFlags(cmd, ENGINE_FLAGS)
    .option('--json', 'end with one JSON line: ids, text, first-position logits and the ledger summary')
    .action(async (f: RunFlags & Record<string, unknown>) => {
      if (f.prompt !== undefined && f.promptIds !== undefined) throw new Error('give --prompt or --prompt-ids, not both');
      const e = ENGINE_FLAGS.read(f) as Partial<EngineOptions>;
      const needsTokenizer = f.promptIds ? undefined : `the prompt is text${f.prompt === undefined ? ` (default "${DEFAULT_PROMPT}")` : ''}; give --prompt-ids to run without a tokenizer`;
      const { engine, model, offloadDir, kvOffloadDir } = await openCliEngine(e, { needsTokenizer });
      try {
        const gen = engine.generationDefaults;
        const promptIds = f.promptIds ?? engine.encode(f.prompt ?? DEFAULT_PROMPT);
        const opts: GenerateOptions = {
          maxTokens: f.maxTokens,
          temperature: f.temperature ?? gen.temperature ?? 1,
          topK: f.topK ?? gen.topK,
          topP: f.topP ?? gen.topP,
          minP: f.minP ?? gen.minP,
          seed: f.seed,
          returnPromptLogits: Boolean(f.json),
        };
        const ac = new AbortController();
        const onSig = () => ac.abort(new Error('interrupted'));
        process.once('SIGINT', onSig);
        const h = engine.submit(promptIds, { ...opts, signal: ac.signal });
        for await (const ev of h.events) process.stdout.write(ev.text);
        process.off('SIGINT', onSig);
        const out = await h.done;
        process.stdout.write('\n');
        if (f.json) {
          const top5 = out.promptLogits ? topK(out.promptLogits, 5) : [];
          const mem = engine.memoryReport();
          const line = {
            model,
            backend: engine.backend.name,
            numerics: engine.backend.capabilities.numerics ?? 'exact',
            matmul_precision: engine.matmulPrecision,
            batch_invariant: engine.backend.capabilities.batchInvariant === true,
            kv_cache_dtype: engine.kvDtype,
            // Stages, links and micro-batches with --pipeline-parallel; null for one stage.
            pipeline: engine.pipelineDescription() ?? null,
            // Shards (backend, slices, weight and KV bytes each) with --tensor-parallel; null for one backend.
            tensor_parallel: engine.tensorParallelDescription() ?? null,
            prompt_ids: promptIds,
            token_ids: out.tokenIds,
            text: out.text,
            finish_reason: out.finishReason,
            first_logits_top5: top5,
            ledger: out.ledger.summary(),
            // The memory OS after the run: where the weights were and what moved to compute, the
            // configured budgets and, with --kv-vram-budget, the KV pages by tier (memory.kv).
            memory: {
              ...memoryReportJson(mem),
              tiers: tiersJson(mem),
              vram_budget_bytes: e.vramBudget ?? null,
              host_budget_bytes: e.hostBudget ?? null,
              offload_dir: offloadDir ?? null,
              kv_vram_budget_bytes: e.kvVramBudget ?? null,
              kv_host_budget_bytes: e.kvHostBudget ?? null,
              kv_offload_dir: kvOffloadDir ?? null,
              kv_warm_link_share: mem.kv ? (mem.kv.staging?.share ?? 0) : null,
            },
          };
          process.stdout.write(JSON.stringify(line) + '\n');
        }
      } finally {
        engine.dispose();
      }
    });
}

/** The k largest entries as [id, value] pairs, largest first (ties: lower id). */
export function topK(v: Float32Array, k: number): [number, number][] {
  const out: [number, number][] = [];
  for (let i = 0; i < v.length; i++) {
    if (out.length < k || v[i] > out[out.length - 1][1]) {
      out.push([i, v[i]]);
      out.sort((a, b) => b[1] - a[1] || a[0] - b[0]);
      if (out.length > k) out.pop();
    }
  }
  return out;
}
