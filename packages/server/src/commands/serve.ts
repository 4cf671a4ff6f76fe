import type { Command } from 'commander';
import { Option } from 'commander';
import { checkFlags, loadConfigFile, mergeConfig, type ServerConfig } from '../config.js';
import { parseFractionArg, parseIntArg, parseSizeArg } from '../cli-util.js';
import { API_KEY_ENV } from '../security-options.js';
import { startServer } from '../server.js';

interface ServeFlags {
  model?: string;
  config?: string;
  host?: string;
  port?: number;
  apiKey?: string;
  backend?: 'cpu' | 'cuda' | 'auto';
  numerics?: 'exact' | 'bf16';
  matmulPrecision?: 'exact' | 'bf16';
  batchInvariant?: boolean;
  servedModelName?: string;
  maxNumSeqs?: number;
  maxNumBatchedTokens?: number;
  maxModelLen?: number;
  kvCacheBytes?: number;
  kvCacheDtype?: 'auto' | 'f32' | 'bf16';
  maxQueue?: number;
  requestTimeout?: number;
  bodyLimit?: number;
  chatTemplate?: string;
  prefixCaching?: boolean;
  vramBudget?: number;
  hostBudget?: number;
  offloadDir?: string;
  kvVramBudget?: number;
  kvHostBudget?: number;
  kvOffloadDir?: string;
  kvWarmLinkShare?: number;
  pipelineParallel?: number;
  allowSingleDeviceStages?: boolean;
  // --- security options ---
  allowedHosts?: string[];
  maxConnections?: number;
  allowClientPriority?: boolean;
  engineWatchdog?: number;
  accessLog?: boolean;
  // --- end security options ---
}

export function registerServe(program: Command): void {
  program
    .command('serve')
    .description('OpenAI-compatible HTTP server (the embedded default model when --model is absent)')
    .option('--model <dir>', 'model folder')
    .option('--config <file>', 'TOML config file (flags override it)')
    .option('--host <host>', 'address to listen on (default 127.0.0.1)')
    .option('--port <n>', 'port (default 8000; 0 = any free port)', parseIntArg('--port'))
    .option('--api-key <key>', `require Authorization: Bearer <key> on every route but /health (default: $${API_KEY_ENV})`)
    .addOption(new Option('--backend <name>', 'compute backend (default auto)').choices(['cpu', 'cuda', 'auto']))
    .addOption(new Option('--numerics <mode>', "activation rounding: exact (default) or bf16 (transformers' bf16 rounding points)").choices(['exact', 'bf16']))
    .addOption(new Option('--matmul-precision <p>', 'matmuls over more than 8 rows (prefill): exact (default, f32-grade) or bf16 (activations rounded to bf16 once; faster). Default from NERVA_MATMUL').choices(['exact', 'bf16']))
    .option('--batch-invariant', 'batch-invariant decode on CUDA: each request gets the tokens it gets alone, whatever shares the batch (slower decode batches); default NERVA_BATCH_INVARIANT, else off')
    .option('--served-model-name <name>', 'model name clients use (default: the folder name)')
    .option('--max-num-seqs <n>', 'sequences batched together', parseIntArg('--max-num-seqs'))
    .option('--max-num-batched-tokens <n>', 'token budget of one scheduler step', parseIntArg('--max-num-batched-tokens'))
    .option('--max-model-len <n>', 'longest prompt + output', parseIntArg('--max-model-len'))
    .option('--kv-cache-bytes <size>', 'bytes for the paged KV cache (a size: 256MiB, or bytes)', parseSizeArg('--kv-cache-bytes'))
    .addOption(new Option('--kv-cache-dtype <dtype>', 'KV cache element type: auto (f32 under exact numerics, bf16 under bf16 numerics), f32, or bf16 (keys and values rounded once when stored: half the bytes a token)').choices(['auto', 'f32', 'bf16']))
    .option('--max-queue <n>', 'sequences that may wait beyond max-num-seqs before 429 (default 256)', parseIntArg('--max-queue'))
    .option('--request-timeout <s>', 'seconds before an unfinished request is aborted (default 600)', parseIntArg('--request-timeout'))
    .option('--body-limit <bytes>', 'largest request body (default 1 MiB)', parseIntArg('--body-limit'))
    .option('--chat-template <file>', 'Jinja chat template replacing the model\'s')
    .option('--no-prefix-caching', 'disable prefix caching')
    .option('--vram-budget <size>', 'compute-tier memory the engine may use, e.g. 4GiB (G = GiB); weights that do not fit stream from host memory', parseSizeArg('--vram-budget'))
    .option('--host-budget <size>', 'host memory for streamed weights, e.g. 32GiB; beyond it they spill to --offload-dir', parseSizeArg('--host-budget'))
    .option('--offload-dir <dir>', 'directory of the disk tier for weights the host budget cannot hold')
    .option('--kv-vram-budget <size>', 'tiered KV: compute-tier memory for hot KV pages, e.g. 64MiB; pages beyond it move to pinned host memory (same tokens)', parseSizeArg('--kv-vram-budget'))
    .option('--kv-host-budget <size>', 'tiered KV: pinned host memory for warm KV pages (default 8x --kv-vram-budget); beyond it they spill to --kv-offload-dir', parseSizeArg('--kv-host-budget'))
    .option('--kv-offload-dir <dir>', 'tiered KV: directory of the cold tier for KV pages (swapped-out sequences)')
    .option('--kv-warm-link-share <x>', 'tiered KV: share (0..1) of the warm KV pages the GPU attends over itself, streamed through VRAM over PCIe a layer ahead, while the host CPU attends over the rest (default on a GPU: what a staging of a quarter of --kv-vram-budget holds, up to 1; 0 on the CPU backend)', parseFractionArg('--kv-warm-link-share'))
    .option('--pipeline-parallel <n>', 'pipeline stages: the layers split into N contiguous ranges (N > 1 needs N GPUs on CUDA; any N on the CPU backend)', parseIntArg('--pipeline-parallel', { positive: true }))
    .option('--allow-single-device-stages', 'place every pipeline stage on one GPU (tests the pipeline on a one-GPU machine)')
    // --- security options ---
    .option('--allowed-hosts <hosts>', 'Host header values accepted besides loopback and the bound address (comma-separated; * = any)', (v: string) => v.split(',').map((h) => h.trim()).filter(Boolean))
    .option('--max-connections <n>', 'open connections at most (default 512)', parseIntArg('--max-connections', { positive: true }))
    .option('--allow-client-priority', "honour the request field 'priority' (default: a non-zero priority is a 400)")
    .option('--engine-watchdog <s>', 'seconds the engine may make no progress with work outstanding before it is restarted (default 120)', parseIntArg('--engine-watchdog', { positive: true }))
    .option('--no-access-log', 'no structured access log (JSON lines on stdout)')
    // --- end security options ---
    .action(async (f: ServeFlags) => {
      const flags: Partial<ServerConfig> = checkFlags({
        model: f.model,
        host: f.host,
        port: f.port,
        apiKey: f.apiKey,
        backend: f.backend,
        numerics: f.numerics,
        matmulPrecision: f.matmulPrecision,
        batchInvariant: f.batchInvariant,
        servedModelName: f.servedModelName,
        maxNumSeqs: f.maxNumSeqs,
        maxNumBatchedTokens: f.maxNumBatchedTokens,
        maxModelLen: f.maxModelLen,
        kvCacheBytes: f.kvCacheBytes,
        kvCacheDtype: f.kvCacheDtype,
        maxQueue: f.maxQueue,
        requestTimeoutS: f.requestTimeout,
        bodyLimitBytes: f.bodyLimit,
        chatTemplate: f.chatTemplate,
        // Commander sets prefixCaching=true unless --no-prefix-caching; only the flag overrides the file.
        enablePrefixCaching: f.prefixCaching === false ? false : undefined,
        vramBudget: f.vramBudget,
        hostBudget: f.hostBudget,
        offloadDir: f.offloadDir,
        kvVramBudget: f.kvVramBudget,
        kvHostBudget: f.kvHostBudget,
        kvOffloadDir: f.kvOffloadDir,
        kvWarmLinkShare: f.kvWarmLinkShare,
        pipelineParallel: f.pipelineParallel,
        allowSingleDeviceStages: f.allowSingleDeviceStages,
        // --- security options ---
        allowedHosts: f.allowedHosts,
        maxConnections: f.maxConnections,
        allowClientPriority: f.allowClientPriority,
        engineWatchdogS: f.engineWatchdog,
        // --- end security options ---
      });
      const file = f.config ? await loadConfigFile(f.config) : {};
      const config = mergeConfig(file, flags);
      const log = (line: string) => process.stderr.write(line + '\n');
      const server = await startServer(config, {
        log,
        logger: f.accessLog !== false,
        // The engine died and would not come back: exit non-zero for the supervisor to restart us.
        onFatal: () => process.exit(1),
      });
      log(`nerva: serving ${server.state.modelName} at ${server.url}/v1 (loading the model; GET ${server.url}/health answers 200 when ready)`);
      server.ready.then(
        () => log(`nerva: ready at ${server.url}/v1`),
        (e: Error) => log(`nerva: error: the model failed to load: ${e.message}`),
      );
      await new Promise<void>((resolveStop) => {
        const stop = (sig: string) => {
          log(`nerva: ${sig}: draining in-flight requests`);
          server.shutdown().then(() => resolveStop(), (e: Error) => {
            log(`nerva: error during shutdown: ${e.message}`);
            resolveStop();
          });
        };
        process.once('SIGTERM', () => stop('SIGTERM'));
        process.once('SIGINT', () => stop('SIGINT'));
      });
    });
}
