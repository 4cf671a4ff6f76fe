#!/usr/bin/env node
import { Command, InvalidArgumentError } from 'commander';
import { engineOption, type BackendChoice, type EngineOptionName, type EngineOptions } from '@nerva/engine';
import { GGUF_CONVERT_TYPES, type GgufConvertType } from '@nerva/models';
import { addFlags, defaultModelDir, deriveFlags, parseIntArg, type FlagOverride, type FlagPick } from '@nerva/server';
import { decodeProbe } from './probes/decode.js';
import { forkProbe } from './probes/fork.js';
import { generateProbe } from './probes/generate.js';
import { llamaCppProbe } from './probes/llama-cpp.js';
import { longContextProbe } from './probes/long-context.js';
import { parseGemmShapes } from './measure.js';
import { offloadProbe } from './probes/offload.js';
import { prefillProbe } from './probes/prefill.js';
import { QUANT_ERROR_TYPES, quantErrorProbe } from './probes/quant-error.js';
import { serveProbe } from './probes/serve.js';
import { throughputProbe } from './probes/throughput.js';

const int = (name: string) => parseIntArg(name, { positive: true });
const nonNegInt = (name: string) => (v: string): number => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError(`${name} must be a non-negative integer, got "${v}"`);
  return n;
};
type EngineFlagValues = Partial<Omit<EngineOptions, 'backend'>> & { backend: BackendChoice };

/**
 * Add the engine options `names` (@nerva/engine's ENGINE_OPTIONS) to a probe's command, with the
 * probe's own readings of some; returns the reader of their values (defaults applied).
 */
function engineFlags(cmd: Command, names: readonly EngineOptionName[], overrides: Partial<Record<EngineOptionName, FlagOverride>> = {}): (f: Record<string, unknown>) => EngineFlagValues {
  const flags = deriveFlags(
    names.map((n): FlagPick => (overrides[n] ? [engineOption(n), overrides[n]] : engineOption(n))),
    { applyDefaults: true },
  );
  addFlags(cmd, flags);
  return (f) => flags.read(f) as EngineFlagValues;
}

const program = new Command().name('nerva-bench').description('NERVA benchmarks: one JSON line per probe').exitOverride();
const print = (o: unknown): void => {
  process.stdout.write(JSON.stringify(o) + "\n");
};

{
  const cmd = program.command('generate').description('single-stream generation on a model (default: the embedded model)');
  const engine = engineFlags(cmd, ['model', 'backend']);
  cmd
    .option('--prompt-len <n>', 'prompt tokens', int('--prompt-len'), 16)
    .option('--new-tokens <n>', 'generated tokens', int('--new-tokens'), 128)
    .action(async (f) => {
      const e = engine(f);
      print(await generateProbe({ model: e.model ?? defaultModelDir(), backend: e.backend, promptLen: f.promptLen, newTokens: f.newTokens }));
    });
}

{
  const cmd = program
    .command('long-context')
    .description('decode at a long context with the KV all hot, then 2x and 4x the hot KV budget (the rest warm, attended on the host)');
  const engine = engineFlags(cmd, ['model', 'backend', 'kvCacheDtype']);
  cmd
    .option('--context <n>', 'context tokens (the prompt)', int('--context'), 2048)
    .option('--new-tokens <n>', 'generated tokens', int('--new-tokens'), 64)
    .option('--ratios <list>', 'KV-to-hot-budget ratios besides all-hot, comma-separated', (v: string) => v.split(',').map(Number), [2, 4])
    .option('--link-shares <list>', 'kvWarmLinkShare values (0..1) to run each ratio with, comma-separated: the device reads that share of the warm pages itself', (v: string) => {
      const l = v.split(',').map(Number);
      if (l.some((x) => !(x >= 0 && x <= 1))) throw new InvalidArgumentError(`--link-shares takes numbers from 0 to 1, got "${v}"`);
      return l;
    })
    .action(async (f) => {
      const e = engine(f);
      print(
        await longContextProbe({
          model: e.model ?? defaultModelDir(),
          backend: e.backend,
          context: f.context,
          newTokens: f.newTokens,
          ratios: f.ratios,
          kvCacheDtype: e.kvCacheDtype,
          linkShares: f.linkShares,
        }),
      );
    });
}

{
  const cmd = program.command('decode').description('batch-1 decode speed against the in-run memory roofline');
  cmd.option('--prompt-len <n>', 'prompt tokens', int('--prompt-len'), 128).option('--new-tokens <n>', 'generated tokens', int('--new-tokens'), 256);
  const engine = engineFlags(
    cmd,
    [
      'model',
      'backend',
      'profile',
      'numerics',
      'matmulPrecision',
      'batchInvariant',
      'kvCacheDtype',
      'vramBudget',
      'hostBudget',
      'offloadDir',
      'kvVramBudget',
      'kvHostBudget',
      'kvOffloadDir',
      'pipelineParallel',
      'pipelineMicroBatches',
      'stageVramBudgets',
      'tensorParallel',
      'allowSingleDeviceStages',
      'runAhead',
      'runAheadSteps',
    ],
    { profile: { help: 'time buckets per token (disables graphs)' } },
  );
  cmd.action(async (f) => {
    const e = engine(f);
    print(await decodeProbe({ ...e, model: e.model ?? defaultModelDir(), promptLen: f.promptLen, newTokens: f.newTokens }));
  });
}

{
  const cmd = program
    .command('prefill')
    .description('prefill tokens/s and MFU against the bf16 GEMM rate measured in the same run (one chunk, prefix caching off)');
  const engine = engineFlags(cmd, ['model', 'backend', 'matmulPrecision', 'numerics', 'kvCacheDtype', 'vramBudget', 'batchInvariant']);
  cmd
    .option('--prompt-len <n>', 'prompt tokens of each prefill', int('--prompt-len'), 4096)
    .option('--repeats <n>', 'timed prefills (after a warm-up), each of a distinct prompt', int('--repeats'), 3)
    .option('--chunk <n>', 'largest prefill chunk (maxNumBatchedTokens; default: the prompt length, one chunk)', int('--chunk'))
    .option('--gemm-shapes <list>', 'GEMM shapes of the rate measurement, MxKxN[,...] (default 4096x4096x12288,4096x4096x4096 on a GPU, small ones on the CPU)', (v: string) => {
      try {
        return parseGemmShapes(v);
      } catch (e) {
        throw new InvalidArgumentError((e as Error).message);
      }
    })
    .option('--gemm-min-ms <ms>', "device time of each shape's timed products, at least", int('--gemm-min-ms'), 200)
    .option('--profile', 'after the timed prefills, one more with every op timed by device events: "profile" in the line (ms by op class, GEMM and attention TFLOP/s)')
    .action(async (f) => {
      const e = engine(f);
      print(
        await prefillProbe({
          profile: f.profile ?? false,
          model: e.model ?? defaultModelDir(),
          backend: e.backend,
          promptLen: f.promptLen,
          repeats: f.repeats,
          chunk: f.chunk,
          matmulPrecision: e.matmulPrecision,
          numerics: e.numerics,
          kvCacheDtype: e.kvCacheDtype,
          vramBudget: e.vramBudget,
          batchInvariant: e.batchInvariant,
          gemmShapes: f.gemmShapes,
          gemmMinMs: f.gemmMinMs,
        }),
      );
    });
}

{
  const cmd = program
    .command('fork')
    .description(
      'shared-prefix forks (Engine.submitFork): N sequences continue one prompt prefilled once (its full KV blocks shared by refcount) against the same N requests one after the other; decode wall time, speedup, identical tokens',
    );
  const engine = engineFlags(cmd, ['model', 'backend', 'kvCacheDtype', 'matmulPrecision', 'batchInvariant']);
  cmd
    .option('--n <n>', 'forks', int('--n'), 32)
    .option('--prompt-len <n>', 'prompt tokens', int('--prompt-len'), 512)
    .option('--new-tokens <n>', 'tokens each fork generates', int('--new-tokens'), 128)
    .option(
      '--temperature <t>',
      'sampling temperature of every fork (0: greedy)',
      (v: string) => {
        const t = Number(v);
        if (!Number.isFinite(t) || t < 0) throw new InvalidArgumentError('--temperature must be a number >= 0');
        return t;
      },
      0.8,
    )
    .option(
      '--seed <s>',
      'fork i samples with seed + i (so does sequential run i)',
      (v: string) => {
        const s = Number(v);
        if (!Number.isSafeInteger(s) || s < 0) throw new InvalidArgumentError('--seed must be a non-negative integer');
        return s;
      },
      1,
    )
    .option('--prefix-caching', 'enable prefix caching (default off: the forks alone share the prompt blocks, every sequential run prefills it)')
    .option('--profile', 'after the timed runs, a few steps with every op timed by device events: "profile" in the line (a mean step of the n forks and of one request, ms by op class)')
    .option('--vs-default', 'also run the N requests one by one on the default decode path (decode_speedup_vs_default; on by itself with --batch-invariant)')
    .option('--no-sequential', 'the forks alone (no one-by-one runs): the fork step and tokens_sha256, to compare builds quickly')
    .action(async (f) => {
      const e = engine(f);
      print(
        await forkProbe({
          ...(f.vsDefault === true ? { vsDefault: true } : {}),
          ...(f.sequential === false ? { sequential: false } : {}),
          model: e.model ?? defaultModelDir(),
          backend: e.backend,
          n: f.n,
          promptLen: f.promptLen,
          newTokens: f.newTokens,
          temperature: f.temperature,
          seed: f.seed,
          kvCacheDtype: e.kvCacheDtype,
          matmulPrecision: e.matmulPrecision,
          batchInvariant: e.batchInvariant,
          prefixCaching: f.prefixCaching === true,
          profile: f.profile === true,
        }),
      );
    });
}

{
  const cmd = program
    .command('offload')
    .description('batch-1 greedy decode under a VRAM budget: bytes moved per token by path, prefetch, fraction of the host-to-device limit');
  const engine = engineFlags(cmd, ['model', 'backend', 'vramBudget', 'hostBudget', 'offloadDir', 'kvCacheBytes', 'numerics', 'hostCompute'], {
    vramBudget: { mandatory: true },
    kvCacheBytes: { help: "KV cache bytes (default: one sequence of the probe's length)" },
  });
  cmd
    .option('--prompt-len <n>', 'prompt tokens', int('--prompt-len'), 16)
    .option('--new-tokens <n>', 'generated tokens', int('--new-tokens'), 32)
    .option('--accelerate-json <file>', 'a JSON line of tools/gpu/accelerate_offload.py on the same checkpoint and budget: adds speedup_vs_accelerate')
    .action(async (f) => {
      const e = engine(f);
      print(
        await offloadProbe({
          accelerateJson: f.accelerateJson,
          hostCompute: e.hostCompute,
          model: e.model ?? defaultModelDir(),
          backend: e.backend,
          numerics: e.numerics,
          vramBudget: e.vramBudget!,
          hostBudget: e.hostBudget,
          offloadDir: e.offloadDir,
          promptLen: f.promptLen,
          newTokens: f.newTokens,
          kvCacheBytes: e.kvCacheBytes,
        }),
      );
    });
}

{
  const cmd = program
    .command('llama-cpp')
    .description("llama.cpp's greedy decode of a GGUF file (node-llama-cpp's CPU build) beside NERVA's on the same file, prompt and device class: tok/s of each, file and decode bytes, tokens equal");
  const engine = engineFlags(cmd, ['model', 'backend'], {
    model: { mandatory: true, help: 'a GGUF file (both engines load it)' },
    backend: { default: 'cpu', help: "NERVA's backend (llama.cpp runs on the CPU: only its CPU build is installed, unless --llama-bench brings one)" },
  });
  cmd
    .option('--tokens <n>', 'generated tokens of each engine', int('--tokens'), 64)
    .option('--prompt-len <n>', 'prompt tokens (synthetic ids)', int('--prompt-len'), 16)
    .option('--threads <n>', "llama.cpp's CPU threads (NERVA's CPU backend computes on one)", int('--threads'), 1)
    .option('--llama-bench <path>', "a llama.cpp llama-bench binary to run as the peer (e.g. one built for the GPU; its decode rate from an empty context, every layer on the GPU unless --backend cpu)")
    .action(async (f) => {
      const e = engine(f);
      print(
        await llamaCppProbe({
          model: e.model!,
          backend: e.backend,
          promptLen: f.promptLen,
          tokens: f.tokens,
          threads: f.threads,
          ...(f.llamaBench !== undefined ? { llamaBench: f.llamaBench as string } : {}),
        }),
      );
    });
}

{
  const cmd = program.command('serve').description('OpenAI server throughput: N concurrent streaming clients against an in-process server');
  const engine = engineFlags(cmd, ['model', 'backend', 'decodePromptBudget', 'maxNumBatchedTokens'], {
    maxNumBatchedTokens: { help: 'token budget of one scheduler step (the engine default otherwise)' },
  });
  cmd
    .option('--concurrency <n>', 'concurrent streaming clients', int('--concurrency'), 8)
    .option('--requests <n>', 'requests in all (default: one per client)', int('--requests'))
    .option('--max-tokens <n>', 'tokens per request', int('--max-tokens'), 32)
    .option('--prompt-len <n>', 'prompt tokens of each request (token ids, distinct per request)', int('--prompt-len'), 16)
    .option('--vs-decode', "first the engine's decode probe on the same model, prompt length and token count (its own line); the serve line gets stream_over_decode")
    .action(async (f) => {
      const e = engine(f);
      const lines = await serveProbe({
        model: e.model,
        backend: e.backend,
        concurrency: f.concurrency,
        requests: f.requests,
        maxTokens: f.maxTokens,
        promptLen: f.promptLen,
        vsDecode: f.vsDecode === true,
        ...(e.decodePromptBudget !== undefined ? { decodePromptBudget: e.decodePromptBudget } : {}),
        ...(e.maxNumBatchedTokens !== undefined ? { maxNumBatchedTokens: e.maxNumBatchedTokens } : {}),
      });
      for (const l of lines) print(l);
    });
}

{
  const cmd = program
    .command('throughput')
    .description("nano-vllm's throughput benchmark: every request of a random workload submitted at once, output tokens/s, then requests rerun alone to check their tokens");
  const multi = ['vramBudget', 'pipelineParallel', 'pipelineMicroBatches', 'stageVramBudgets', 'tensorParallel', 'allowSingleDeviceStages'] as const;
  const engine = engineFlags(cmd, ['model', 'backend', 'maxNumSeqs', 'maxNumBatchedTokens', 'decodePromptBudget', 'kvCacheBytes', 'kvCacheDtype', 'numerics', 'matmulPrecision', 'batchInvariant', ...multi], {
    maxNumSeqs: { help: 'sequences the engine batches at once', default: 256 },
    maxNumBatchedTokens: { help: 'token budget of one scheduler step (the engine default otherwise)' },
    kvCacheBytes: { help: 'KV cache bytes (default: the whole workload, where the device has room)' },
  });
  cmd
    .option('--requests <n>', 'requests in the workload (default 256)', int('--requests'))
    .option('--min-len <n>', 'smallest prompt length and max_tokens (default 100)', int('--min-len'))
    .option('--max-input-len <n>', 'largest prompt length (default 1024)', int('--max-input-len'))
    .option('--max-output-len <n>', 'largest max_tokens (default 1024)', int('--max-output-len'))
    .option('--seed <n>', 'workload seed (default 0)', nonNegInt('--seed'))
    .option('--workload <file>', 'run this workload file (as --workload-out writes it) instead of generating one')
    .option('--workload-out <file>', 'write the workload as JSON (tools/gpu/torch_throughput.py runs the same requests)')
    .option('--workload-only', 'write the workload (--workload-out) and print its description; run nothing')
    .option('--verify <k>', 'rerun K requests alone (evenly spread, the longest included) and compare their tokens', nonNegInt('--verify'), 8)
    .option('--baseline <file>', 'a JSON line from tools/gpu/torch_throughput.py on the same workload: adds the ratio to it')
    .option('--tokens-out <file>', "write every request's batched tokens as JSON")
    .option('--profile', 'after the timed run, a few decode steps of the first --max-num-seqs requests with every op timed by device events: "profile" in the line (a mean step, ms by op class; the layers op by op, not the captured step of the timed run)')
    .action(async (f) => {
      const generated = ['requests', 'minLen', 'maxInputLen', 'maxOutputLen', 'seed'].filter((k) => f[k] !== undefined);
      if (f.workload !== undefined && generated.length > 0) {
        throw new InvalidArgumentError(`--workload reads the requests from a file; it cannot be combined with ${generated.map((k) => '--' + k.replace(/[A-Z]/g, (c: string) => '-' + c.toLowerCase())).join(', ')}`);
      }
      if (f.workloadOnly && f.workloadOut === undefined) throw new InvalidArgumentError('--workload-only needs --workload-out <file>');
      const e = engine(f);
      print(
        await throughputProbe({
          model: e.model ?? defaultModelDir(),
          backend: e.backend,
          numerics: e.numerics,
          kvCacheDtype: e.kvCacheDtype,
          matmulPrecision: e.matmulPrecision,
          batchInvariant: e.batchInvariant,
          pipelineParallel: e.pipelineParallel,
          pipelineMicroBatches: e.pipelineMicroBatches,
          tensorParallel: e.tensorParallel,
          allowSingleDeviceStages: e.allowSingleDeviceStages,
          stageVramBudgets: e.stageVramBudgets,
          vramBudget: e.vramBudget,
          requests: f.requests,
          minLen: f.minLen,
          maxInputLen: f.maxInputLen,
          maxOutputLen: f.maxOutputLen,
          seed: f.seed,
          workloadFile: f.workload,
          workloadOut: f.workloadOut,
          workloadOnly: f.workloadOnly,
          verify: f.verify,
          maxNumSeqs: e.maxNumSeqs,
          maxNumBatchedTokens: e.maxNumBatchedTokens,
          ...(e.decodePromptBudget !== undefined ? { decodePromptBudget: e.decodePromptBudget } : {}),
          kvCacheBytes: e.kvCacheBytes,
          baselineFile: f.baseline,
          tokensOut: f.tokensOut,
          profile: f.profile === true,
        }),
      );
    });
}

{
  const cmd = program
    .command('quant-error')
    .description("the quantization's own error: each GGUF type against the original model on teacher-forced text (perplexity, KL, top-1 agreement); one JSON line per type");
  const engine = engineFlags(cmd, ['model', 'backend']);
  cmd
    .requiredOption('--text <file>', 'UTF-8 text to score')
    .option('--tokens <n>', 'tokens of the text scored', int('--tokens'), 2048)
    .option('--window <n>', "tokens a window, each scored from its first token (default: the model's max positions)", int('--window'))
    .option('--types <list>', 'GGUF types, comma-separated', (v: string) => {
      const l = v.split(',');
      for (const t of l) if (!(GGUF_CONVERT_TYPES as readonly string[]).includes(t)) throw new InvalidArgumentError(`--types takes ${GGUF_CONVERT_TYPES.join(', ')}; got "${t}"`);
      return l as GgufConvertType[];
    }, [...QUANT_ERROR_TYPES])
    .action(async (f) => {
      const e = engine(f);
      await quantErrorProbe({ model: e.model ?? defaultModelDir(), backend: e.backend, text: f.text, tokens: f.tokens, window: f.window, types: f.types, onLine: print });
    });
}

try {
  await program.parseAsync(process.argv);
} catch (e) {
  if ((e as { exitCode?: number }).exitCode !== undefined && (e as Error).name === 'CommanderError') process.exit((e as { exitCode: number }).exitCode);
  process.stderr.write(`nerva-bench: error: ${(e as Error).message}\n`);
  process.exit(1);
}
