#!/usr/bin/env node
import { Command, InvalidArgumentError, Option } from 'commander';
import { defaultModelDir, parseIntArg, parseSizeArg } from '@nerva/server';
import { decodeProbe } from './probes/decode.js';
import { forkProbe } from './probes/fork.js';
import { generateProbe } from './probes/generate.js';
import { longContextProbe } from './probes/long-context.js';
import { parseGemmShapes } from './measure.js';
import { offloadProbe } from './probes/offload.js';
import { prefillProbe } from './probes/prefill.js';
import { serveProbe } from './probes/serve.js';
import { throughputProbe } from './probes/throughput.js';

const int = (name: string) => parseIntArg(name, { positive: true });
const nonNegInt = (name: string) => (v: string): number => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError(`${name} must be a non-negative integer, got "${v}"`);
  return n;
};
const vramOpt = () => new Option('--vram-budget <size>', 'compute-tier memory the engine may use, e.g. 4GiB (G = GiB)').argParser(parseSizeArg('--vram-budget'));
const hostOpt = () => new Option('--host-budget <size>', 'host memory for streamed weights; beyond it they spill to --offload-dir').argParser(parseSizeArg('--host-budget'));
const offloadDirOpt = () => new Option('--offload-dir <dir>', 'disk tier directory');
const kvVramOpt = () =>
  new Option('--kv-vram-budget <size>', 'tiered KV: compute-tier memory for hot KV pages, e.g. 64MiB; pages beyond it move to pinned host memory').argParser(parseSizeArg('--kv-vram-budget'));
const kvHostOpt = () => new Option('--kv-host-budget <size>', 'tiered KV: pinned host memory for warm KV pages (default 8x the hot pool)').argParser(parseSizeArg('--kv-host-budget'));
const kvOffloadDirOpt = () => new Option('--kv-offload-dir <dir>', 'tiered KV: cold tier directory');
const kvDtypeOpt = () => new Option('--kv-cache-dtype <dtype>', 'KV cache element type: auto (f32 under exact numerics), f32 or bf16').choices(['auto', 'f32', 'bf16']).default('auto');
// No default: NERVA_MATMUL, else 'exact', applies when the flag is absent.
const matmulOpt = () =>
  new Option('--matmul-precision <p>', 'matmuls over more than 8 rows (prefill): exact (f32-grade, split-bf16 GEMMs on CUDA) or bf16 (activations rounded to bf16 once, one GEMM); default NERVA_MATMUL, else exact').choices(['exact', 'bf16']);
// No default: NERVA_BATCH_INVARIANT, else off, applies when the flag is absent.
const batchInvOpt = () =>
  new Option('--batch-invariant', 'batch-invariant decode on CUDA: each decode row bit for bit what it computes alone (one batch-invariant matmul kernel at every row count); default NERVA_BATCH_INVARIANT, else off');
const backendOpt = () => new Option('--backend <name>', 'compute backend').choices(['cpu', 'cuda', 'auto']).default('auto');

const program = new Command().name('nerva-bench').description('NERVA benchmarks: one JSON line per probe').exitOverride();
const print = (o: unknown): void => {
  process.stdout.write(JSON.stringify(o) + "\n");
};

program
  .command('generate')
  .description('single-stream generation on a model (default: the embedded model)')
  .option('--model <dir>')
  .addOption(backendOpt())
  .option('--prompt-len <n>', 'prompt tokens', int('--prompt-len'), 16)
  .option('--new-tokens <n>', 'generated tokens', int('--new-tokens'), 128)
  .action(async (f) => print(await generateProbe({ model: f.model ?? defaultModelDir(), backend: f.backend, promptLen: f.promptLen, newTokens: f.newTokens })));

program
  .command('long-context')
  .description('decode at a long context with the KV all hot, then 2x and 4x the hot KV budget (the rest warm, attended on the host)')
  .option('--model <dir>')
  .addOption(backendOpt())
  .option('--context <n>', 'context tokens (the prompt)', int('--context'), 2048)
  .option('--new-tokens <n>', 'generated tokens', int('--new-tokens'), 64)
  .option('--ratios <list>', 'KV-to-hot-budget ratios besides all-hot, comma-separated', (v: string) => v.split(',').map(Number), [2, 4])
  .addOption(kvDtypeOpt())
  .option('--link-shares <list>', 'kvWarmLinkShare values (0..1) to run each ratio with, comma-separated: the device reads that share of the warm pages itself', (v: string) => {
    const l = v.split(',').map(Number);
    if (l.some((x) => !(x >= 0 && x <= 1))) throw new InvalidArgumentError(`--link-shares takes numbers from 0 to 1, got "${v}"`);
    return l;
  })
  .action(async (f) =>
    print(
      await longContextProbe({ model: f.model ?? defaultModelDir(), backend: f.backend, context: f.context, newTokens: f.newTokens, ratios: f.ratios, kvCacheDtype: f.kvCacheDtype, linkShares: f.linkShares }),
    ),
  );

program
  .command('decode')
  .description('batch-1 decode speed against the in-run memory roofline')
  .option('--model <dir>')
  .addOption(backendOpt())
  .option('--prompt-len <n>', 'prompt tokens', int('--prompt-len'), 128)
  .option('--new-tokens <n>', 'generated tokens', int('--new-tokens'), 256)
  .option('--profile', 'time buckets per token (disables graphs)')
  .addOption(new Option('--numerics <mode>', 'activation rounding: exact or bf16').choices(['exact', 'bf16']).default('exact'))
  .addOption(matmulOpt())
  .addOption(batchInvOpt())
  .addOption(kvDtypeOpt())
  .addOption(vramOpt())
  .addOption(hostOpt())
  .addOption(offloadDirOpt())
  .addOption(kvVramOpt())
  .addOption(kvHostOpt())
  .addOption(kvOffloadDirOpt())
  .option('--pipeline-parallel <n>', 'pipeline stages (N > 1 needs N GPUs on CUDA unless --allow-single-device-stages)', int('--pipeline-parallel'))
  .option('--allow-single-device-stages', 'place every pipeline stage on one GPU (tests the pipeline on a one-GPU machine)')
  .option('--no-run-ahead', 'wait for each decode step\'s tokens before enqueuing the next (engine option runAhead off)')
  .option('--run-ahead-steps <n>', 'decode steps one graph replay enqueued ahead may run (engine option runAheadSteps)', int('--run-ahead-steps'))
  .action(async (f) =>
    print(
      await decodeProbe({
        model: f.model ?? defaultModelDir(),
        backend: f.backend,
        numerics: f.numerics,
        matmulPrecision: f.matmulPrecision,
        batchInvariant: f.batchInvariant,
        kvCacheDtype: f.kvCacheDtype,
        promptLen: f.promptLen,
        newTokens: f.newTokens,
        profile: f.profile,
        vramBudget: f.vramBudget,
        hostBudget: f.hostBudget,
        offloadDir: f.offloadDir,
        kvVramBudget: f.kvVramBudget,
        kvHostBudget: f.kvHostBudget,
        kvOffloadDir: f.kvOffloadDir,
        pipelineParallel: f.pipelineParallel,
        allowSingleDeviceStages: f.allowSingleDeviceStages,
        ...(f.runAhead === false ? { runAhead: false } : {}),
        ...(f.runAheadSteps !== undefined ? { runAheadSteps: f.runAheadSteps } : {}),
      }),
    ),
  );

program
  .command('prefill')
  .description('prefill tokens/s and MFU against the bf16 GEMM rate measured in the same run (one chunk, prefix caching off)')
  .option('--model <dir>')
  .addOption(backendOpt())
  .option('--prompt-len <n>', 'prompt tokens of each prefill', int('--prompt-len'), 4096)
  .option('--repeats <n>', 'timed prefills (after a warm-up), each of a distinct prompt', int('--repeats'), 3)
  .option('--chunk <n>', 'largest prefill chunk (maxNumBatchedTokens; default: the prompt length, one chunk)', int('--chunk'))
  .addOption(matmulOpt())
  .addOption(new Option('--numerics <mode>', 'activation rounding: exact or bf16').choices(['exact', 'bf16']).default('exact'))
  .addOption(kvDtypeOpt())
  .addOption(vramOpt())
  .option('--gemm-shapes <list>', 'GEMM shapes of the rate measurement, MxKxN[,...] (default 4096x4096x12288,4096x4096x4096 on a GPU, small ones on the CPU)', (v: string) => {
    try {
      return parseGemmShapes(v);
    } catch (e) {
      throw new InvalidArgumentError((e as Error).message);
    }
  })
  .option('--gemm-min-ms <ms>', 'device time of each shape\'s timed products, at least', int('--gemm-min-ms'), 200)
  .option('--profile', 'after the timed prefills, one more with every op timed by device events: "profile" in the line (ms by op class, GEMM and attention TFLOP/s)')
  .action(async (f) =>
    print(
      await prefillProbe({
        profile: f.profile ?? false,
        model: f.model ?? defaultModelDir(),
        backend: f.backend,
        promptLen: f.promptLen,
        repeats: f.repeats,
        chunk: f.chunk,
        matmulPrecision: f.matmulPrecision,
        numerics: f.numerics,
        kvCacheDtype: f.kvCacheDtype,
        vramBudget: f.vramBudget,
        gemmShapes: f.gemmShapes,
        gemmMinMs: f.gemmMinMs,
      }),
    ),
  );

program
  .command('fork')
  .description('shared-prefix forks (Engine.submitFork): N sequences continue one prompt prefilled once (its full KV blocks shared by refcount) against the same N requests one after the other; decode wall time, speedup, identical tokens')
  .option('--model <dir>')
  .addOption(backendOpt())
  .option('--n <n>', 'forks', int('--n'), 32)
  .option('--prompt-len <n>', 'prompt tokens', int('--prompt-len'), 512)
  .option('--new-tokens <n>', 'tokens each fork generates', int('--new-tokens'), 128)
  .option('--temperature <t>', 'sampling temperature of every fork (0: greedy)', (v: string) => {
    const t = Number(v);
    if (!Number.isFinite(t) || t < 0) throw new InvalidArgumentError('--temperature must be a number >= 0');
    return t;
  }, 0.8)
  .option('--seed <s>', 'fork i samples with seed + i (so does sequential run i)', (v: string) => {
    const s = Number(v);
    if (!Number.isSafeInteger(s) || s < 0) throw new InvalidArgumentError('--seed must be a non-negative integer');
    return s;
  }, 1)
  .addOption(kvDtypeOpt())
  .addOption(matmulOpt())
  .addOption(batchInvOpt())
  .option('--prefix-caching', 'enable prefix caching (default off: the forks alone share the prompt blocks, every sequential run prefills it)')
  .option('--profile', 'after the timed runs, a few steps with every op timed by device events: "profile" in the line (a mean step of the n forks and of one request, ms by op class)')
  .action(async (f) =>
    print(
      await forkProbe({
        model: f.model ?? defaultModelDir(),
        backend: f.backend,
        n: f.n,
        promptLen: f.promptLen,
        newTokens: f.newTokens,
        temperature: f.temperature,
        seed: f.seed,
        kvCacheDtype: f.kvCacheDtype,
        matmulPrecision: f.matmulPrecision,
        batchInvariant: f.batchInvariant,
        prefixCaching: f.prefixCaching === true,
        profile: f.profile === true,
      }),
    ),
  );

/** --host-compute: auto, off, or a fraction strictly between 0 and 1. */
function hostComputeArg(v: string): 'auto' | 'off' | number {
  if (v === 'auto' || v === 'off') return v;
  const x = Number(v);
  if (v.trim() === '' || !Number.isFinite(x) || x <= 0 || x >= 1) throw new InvalidArgumentError(`--host-compute must be auto, off or a fraction in (0, 1), got '${v}'`);
  return x;
}

program
  .command('offload')
  .description('batch-1 greedy decode under a VRAM budget: bytes moved per token by path, prefetch, fraction of the host-to-device limit')
  .option('--model <dir>')
  .addOption(backendOpt())
  .addOption(vramOpt().makeOptionMandatory())
  .addOption(hostOpt())
  .addOption(offloadDirOpt())
  .option('--prompt-len <n>', 'prompt tokens', int('--prompt-len'), 16)
  .option('--new-tokens <n>', 'generated tokens', int('--new-tokens'), 32)
  .option('--kv-cache-bytes <size>', 'KV cache bytes (default: one sequence of the probe\'s length)', parseSizeArg('--kv-cache-bytes'))
  .addOption(new Option('--numerics <mode>', 'activation rounding: exact or bf16').choices(['exact', 'bf16']).default('exact'))
  .option('--host-compute <mode>', "compute near data: 'auto' (split by rates measured at start-up), 'off', or the fraction of each streamed layer's MLP channels the host computes, in (0, 1)", hostComputeArg, 'auto')
  .action(async (f) =>
    print(
      await offloadProbe({
        hostCompute: f.hostCompute,
        model: f.model ?? defaultModelDir(),
        backend: f.backend,
        numerics: f.numerics,
        vramBudget: f.vramBudget,
        hostBudget: f.hostBudget,
        offloadDir: f.offloadDir,
        promptLen: f.promptLen,
        newTokens: f.newTokens,
        kvCacheBytes: f.kvCacheBytes,
      }),
    ),
  );

program
  .command('serve')
  .description('OpenAI server throughput: N concurrent streaming clients against an in-process server')
  .option('--model <dir>')
  .addOption(backendOpt())
  .option('--concurrency <n>', 'concurrent streaming clients', int('--concurrency'), 8)
  .option('--requests <n>', 'requests in all (default: one per client)', int('--requests'))
  .option('--max-tokens <n>', 'tokens per request', int('--max-tokens'), 32)
  .action(async (f) =>
    print(await serveProbe({ model: f.model, backend: f.backend, concurrency: f.concurrency, requests: f.requests, maxTokens: f.maxTokens })),
  );

program
  .command('throughput')
  .description("nano-vllm's throughput benchmark: every request of a random workload submitted at once, output tokens/s, then requests rerun alone to check their tokens")
  .option('--model <dir>')
  .addOption(backendOpt())
  .option('--requests <n>', 'requests in the workload (default 256)', int('--requests'))
  .option('--min-len <n>', 'smallest prompt length and max_tokens (default 100)', int('--min-len'))
  .option('--max-input-len <n>', 'largest prompt length (default 1024)', int('--max-input-len'))
  .option('--max-output-len <n>', 'largest max_tokens (default 1024)', int('--max-output-len'))
  .option('--seed <n>', 'workload seed (default 0)', nonNegInt('--seed'))
  .option('--workload <file>', 'run this workload file (as --workload-out writes it) instead of generating one')
  .option('--workload-out <file>', 'write the workload as JSON (tools/gpu/torch_throughput.py runs the same requests)')
  .option('--workload-only', 'write the workload (--workload-out) and print its description; run nothing')
  .option('--verify <k>', 'rerun K requests alone (evenly spread, the longest included) and compare their tokens', nonNegInt('--verify'), 8)
  .option('--max-num-seqs <n>', 'sequences the engine batches at once', int('--max-num-seqs'), 256)
  .option('--max-num-batched-tokens <n>', 'token budget of one scheduler step (the engine default otherwise)', int('--max-num-batched-tokens'))
  .option('--kv-cache-bytes <size>', 'KV cache bytes (default: the whole workload, where the device has room)', parseSizeArg('--kv-cache-bytes'))
  .addOption(new Option('--kv-cache-dtype <dtype>', 'KV cache element type').choices(['auto', 'f32', 'bf16']).default('auto'))
  .addOption(new Option('--numerics <mode>', 'activation rounding: exact or bf16').choices(['exact', 'bf16']).default('exact'))
  .addOption(matmulOpt())
  .addOption(batchInvOpt())
  .option('--baseline <file>', 'a JSON line from tools/gpu/torch_throughput.py on the same workload: adds the ratio to it')
  .option('--tokens-out <file>', "write every request's batched tokens as JSON")
  .option('--profile', 'after the timed run, a few decode steps of the first --max-num-seqs requests with every op timed by device events: "profile" in the line (a mean step, ms by op class)')
  .action(async (f) => {
    const generated = ['requests', 'minLen', 'maxInputLen', 'maxOutputLen', 'seed'].filter((k) => f[k] !== undefined);
    if (f.workload !== undefined && generated.length > 0) {
      throw new InvalidArgumentError(`--workload reads the requests from a file; it cannot be combined with ${generated.map((k) => '--' + k.replace(/[A-Z]/g, (c: string) => '-' + c.toLowerCase())).join(', ')}`);
    }
    if (f.workloadOnly && f.workloadOut === undefined) throw new InvalidArgumentError('--workload-only needs --workload-out <file>');
    print(
      await throughputProbe({
        model: f.model ?? defaultModelDir(),
        backend: f.backend,
        numerics: f.numerics,
        kvCacheDtype: f.kvCacheDtype,
        matmulPrecision: f.matmulPrecision,
        batchInvariant: f.batchInvariant,
        requests: f.requests,
        minLen: f.minLen,
        maxInputLen: f.maxInputLen,
        maxOutputLen: f.maxOutputLen,
        seed: f.seed,
        workloadFile: f.workload,
        workloadOut: f.workloadOut,
        workloadOnly: f.workloadOnly,
        verify: f.verify,
        maxNumSeqs: f.maxNumSeqs,
        maxNumBatchedTokens: f.maxNumBatchedTokens,
        kvCacheBytes: f.kvCacheBytes,
        baselineFile: f.baseline,
        tokensOut: f.tokensOut,
        profile: f.profile === true,
      }),
    );
  });

try {
  await program.parseAsync(process.argv);
} catch (e) {
  if ((e as { exitCode?: number }).exitCode !== undefined && (e as Error).name === 'CommanderError') process.exit((e as { exitCode: number }).exitCode);
  process.stderr.write(`nerva-bench: error: ${(e as Error).message}\n`);
  process.exit(1);
}
