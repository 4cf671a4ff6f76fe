import { resolve } from 'node:path';
import { Engine, type GenerateOptions } from '@nerva/engine';
import type { Command } from 'commander';
import { Option } from 'commander';
import { checkKvTiers } from '../config.js';
import { defaultModelDir } from '../default-model.js';
import { memoryReportJson, tiersJson } from '../memory-report.js';
import { parseFloatArg, parseFractionArg, parseIdList, parseIntArg, parseSizeArg, progressBar } from '../cli-util.js';

interface RunFlags {
  model?: string;
  prompt?: string;
  promptIds?: number[];
  maxTokens: number;
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  seed?: number;
  backend: 'cpu' | 'cuda' | 'auto';
  numerics?: 'exact' | 'bf16';
  matmulPrecision?: 'exact' | 'bf16';
  batchInvariant?: boolean;
  kvCacheDtype?: 'auto' | 'f32' | 'bf16';
  json?: boolean;
  profile?: boolean;
  vramBudget?: number;
  hostBudget?: number;
  offloadDir?: string;
  kvVramBudget?: number;
  kvHostBudget?: number;
  kvOffloadDir?: string;
  kvWarmLinkShare?: number;
  pipelineParallel?: number;
  allowSingleDeviceStages?: boolean;
}

export function registerRun(program: Command): void {
  program
    .command('run')
    .description('generate text from a model (the embedded default model when --model is absent)')
    .option('--model <dir>', 'model folder (config.json + safetensors + tokenizer.json)')
    .option('--prompt <text>', 'prompt text')
    .option('--prompt-ids <ids>', 'prompt as comma-separated token ids', parseIdList)
    .option('--max-tokens <n>', 'tokens to generate', parseIntArg('--max-tokens'), 128)
    .option('--temperature <t>', 'sampling temperature (0 = greedy); default from generation_config.json', parseFloatArg('--temperature'))
    .option('--top-k <k>', 'top-k (0 = off)', parseIntArg('--top-k'))
    .option('--top-p <p>', 'top-p', parseFloatArg('--top-p'))
    .option('--min-p <p>', 'min-p', parseFloatArg('--min-p'))
    .option('--seed <s>', 'seed for reproducible sampling', parseIntArg('--seed'))
    .addOption(new Option('--backend <name>', 'compute backend').choices(['cpu', 'cuda', 'auto']).default('auto'))
    .addOption(new Option('--numerics <mode>', "activation rounding: exact (default) or bf16 (transformers' bf16 rounding points)").choices(['exact', 'bf16']))
    .addOption(new Option('--matmul-precision <p>', 'matmuls over more than 8 rows (prefill): exact (default, f32-grade) or bf16 (activations rounded to bf16 once; faster). Default from NERVA_MATMUL').choices(['exact', 'bf16']))
    .option('--batch-invariant', 'batch-invariant decode on CUDA: each request gets the tokens it gets alone, whatever shares the batch (slower decode batches); default NERVA_BATCH_INVARIANT, else off')
    .addOption(new Option('--kv-cache-dtype <dtype>', 'KV cache element type: auto (f32 under exact numerics, bf16 under bf16 numerics), f32, or bf16 (keys and values rounded once when stored: half the bytes a token)').choices(['auto', 'f32', 'bf16']))
    .option('--vram-budget <size>', 'compute-tier memory the engine may use, e.g. 4GiB (G = GiB); weights that do not fit stream from host memory', parseSizeArg('--vram-budget'))
    .option('--host-budget <size>', 'host memory for streamed weights, e.g. 32GiB; beyond it they spill to --offload-dir', parseSizeArg('--host-budget'))
    .option('--offload-dir <dir>', 'directory of the disk tier for weights the host budget cannot hold')
    .option('--kv-vram-budget <size>', 'tiered KV: compute-tier memory for hot KV pages, e.g. 64MiB; pages beyond it move to pinned host memory (same tokens)', parseSizeArg('--kv-vram-budget'))
    .option('--kv-host-budget <size>', 'tiered KV: pinned host memory for warm KV pages (default 8x --kv-vram-budget); beyond it they spill to --kv-offload-dir', parseSizeArg('--kv-host-budget'))
    .option('--kv-offload-dir <dir>', 'tiered KV: directory of the cold tier for KV pages (swapped-out sequences)')
    .option('--kv-warm-link-share <x>', 'tiered KV: share (0..1) of the warm KV pages the GPU attends over itself, streamed through VRAM over PCIe a layer ahead, while the host CPU attends over the rest (default on a GPU: what a staging of a quarter of --kv-vram-budget holds, up to 1; 0 on the CPU backend)', parseFractionArg('--kv-warm-link-share'))
    .option('--pipeline-parallel <n>', 'pipeline stages: the layers split into N contiguous ranges (N > 1 needs N GPUs on CUDA; any N on the CPU backend)', parseIntArg('--pipeline-parallel', { positive: true }))
    .option('--allow-single-device-stages', 'place every pipeline stage on one GPU (tests the pipeline on a one-GPU machine)')
    .option('--profile', 'split device time per token into buckets (projection, norm, attention, mlp, sampling)')
    .option('--json', 'end with one JSON line: ids, text, first-position logits and the ledger summary')
    .action(async (f: RunFlags) => {
      if (f.prompt !== undefined && f.promptIds !== undefined) throw new Error('give --prompt or --prompt-ids, not both');
      checkKvTiers(f);
      const model = f.model ?? defaultModelDir();
      const bar = progressBar('loading weights');
      const engine = await Engine.create({
        model,
        backend: f.backend,
        numerics: f.numerics,
        matmulPrecision: f.matmulPrecision,
        ...(f.batchInvariant !== undefined ? { batchInvariant: f.batchInvariant } : {}),
        kvCacheDtype: f.kvCacheDtype,
        profile: f.profile,
        vramBudget: f.vramBudget,
        hostBudget: f.hostBudget,
        offloadDir: f.offloadDir !== undefined ? resolve(f.offloadDir) : undefined,
        kvVramBudget: f.kvVramBudget,
        kvHostBudget: f.kvHostBudget,
        kvOffloadDir: f.kvOffloadDir !== undefined ? resolve(f.kvOffloadDir) : undefined,
        kvWarmLinkShare: f.kvWarmLinkShare,
        pipelineParallel: f.pipelineParallel,
        allowSingleDeviceStages: f.allowSingleDeviceStages,
        onProgress: (p) => bar(p.done, p.total),
      });
      try {
        for (const n of engine.notes) process.stderr.write(`nerva: ${n}\n`);
        const gen = engine.generationDefaults;
        let promptIds: number[];
        if (f.promptIds) promptIds = f.promptIds;
        else if (f.prompt !== undefined) promptIds = engine.encode(f.prompt);
        else promptIds = [engine.spec.bosTokenId ?? engine.eosTokenIds[0] ?? 0];
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
              vram_budget_bytes: f.vramBudget ?? null,
              host_budget_bytes: f.hostBudget ?? null,
              offload_dir: f.offloadDir !== undefined ? resolve(f.offloadDir) : null,
              kv_vram_budget_bytes: f.kvVramBudget ?? null,
              kv_host_budget_bytes: f.kvHostBudget ?? null,
              kv_offload_dir: f.kvOffloadDir !== undefined ? resolve(f.kvOffloadDir) : null,
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
