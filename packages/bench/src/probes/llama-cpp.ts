import { createHash } from 'node:crypto';
import { resolve } from 'node:path';
import { Engine, type BackendChoice } from '@nerva/engine';
import { GgufFile, isGgufPath, type GgufTensorInfo } from '@nerva/models';
import { openLlamaCpp, type LlamaCppGreedyResult } from '../llama-cpp.js';
import { checkLlamaBench, runLlamaBench } from '../llama-bench.js';
import { syntheticPrompt } from '../measure.js';

export interface LlamaCppProbeOptions {
  /** A GGUF file. */
  model: string;
  /** NERVA's backend; llama.cpp runs on the same class of device. */
  backend: BackendChoice;
  promptLen: number;
  /** Generated tokens of each engine. */
  tokens: number;
  /** llama.cpp's CPU threads (NERVA's CPU backend computes on one). */
  threads: number;
  /**
   * A llama.cpp `llama-bench` binary to run as the peer instead of node-llama-cpp (llama-bench.ts):
   * how llama.cpp decodes on a GPU, where only a build for that device can. Its rate only (it
   * prints no tokens), from an empty context.
   */
  llamaBench?: string;
}

/** Weight types both engines compute alike (f32 arithmetic; f16 weights round llama.cpp's activations to f16 only): greedy tokens are expected equal. */
const EXACT_TYPES: ReadonlySet<string> = new Set(['F32', 'F16']);

/**
 * llama.cpp's greedy decode of a GGUF file beside NERVA's on the same file, prompt and class of
 * device: both decode rates, the file's bytes and the weight bytes a decode step reads, and
 * whether the tokens are equal. Where node-llama-cpp cannot run here, the line says why and
 * carries NERVA's figures alone.
 */
export async function llamaCppProbe(o: LlamaCppProbeOptions): Promise<Record<string, unknown>> {
  const path = resolve(o.model);
  if (!isGgufPath(path)) throw new Error(`--model must be a GGUF file (llama.cpp reads no other format): ${o.model}`);
  if (o.llamaBench !== undefined) checkLlamaBench(o.llamaBench);
  const file = await GgufFile.open(path);
  let layout: FileLayout;
  try {
    layout = fileLayout(file);
  } finally {
    await file.close();
  }

  const engine = await Engine.create({ model: path, backend: o.backend, maxNumSeqs: 1, maxModelLen: o.promptLen + o.tokens + 16 });
  let nerva: { tokens: number[]; tokensPerS: number; firstTokenMs: number | null; backend: string; device: string | undefined; weightBytes: number };
  let prompt: number[];
  let warm: number[];
  try {
    prompt = syntheticPrompt(o.promptLen, engine.spec.vocabSize);
    warm = syntheticPrompt(o.promptLen, engine.spec.vocabSize, 7);
    await engine.submit(warm, { maxTokens: Math.min(o.tokens, 8), temperature: 0, ignoreEos: true }).done;
    const out = await engine.submit(prompt, { maxTokens: o.tokens, temperature: 0, ignoreEos: true }).done;
    nerva = {
      tokens: out.tokenIds,
      tokensPerS: out.ledger.summary().decode_tokens_per_s,
      firstTokenMs: out.times.firstToken !== undefined ? out.times.firstToken - out.times.arrival : null,
      backend: engine.backend.name,
      device: engine.backend.capabilities.deviceName,
      weightBytes: engine.weightBytes,
    };
  } finally {
    engine.dispose();
  }

  const line: Record<string, unknown> = {
    probe: 'llama-cpp',
    model: path,
    file_bytes: layout.fileBytes,
    tensor_types: layout.types,
    // Weight bytes a decode step reads from the file's tensors: every tensor whole, but one row of
    // the embedding when the output projection is its own tensor, and the routed experts' share.
    decode_bytes_per_token: layout.decodeBytesPerToken,
    prompt_len: o.promptLen,
    new_tokens: o.tokens,
    nerva: {
      backend: nerva.backend,
      device: nerva.device ?? null,
      tokens_per_s: nerva.tokensPerS,
      first_token_ms: round2(nerva.firstTokenMs),
      // The engine's count of its weight bytes (its CPU backend keeps quantized tensors decoded
      // to f32 in memory, so on the CPU it reads more than this per token).
      weight_bytes: nerva.weightBytes,
      tokens_sha256: digest(nerva.tokens),
    },
  };

  if (o.llamaBench !== undefined) {
    try {
      const b = await runLlamaBench(o.llamaBench, { model: path, tokens: o.tokens, gpu: nerva.backend !== 'cpu', threads: o.threads });
      line.llama_cpp = {
        available: true,
        via: 'llama-bench',
        build_commit: b.buildCommit,
        device: b.device,
        backends: b.backends,
        gpu_layers: b.gpuLayers,
        tokens_per_s: Math.round(b.tokensPerS * 100) / 100,
        stddev_tokens_per_s: Math.round(b.stddevTokensPerS * 100) / 100,
        new_tokens: b.nGen,
        // llama-bench decodes from this context; NERVA from prompt_len tokens.
        context_at_start: b.nDepth,
      };
      line.nerva_over_llama_cpp = Math.round((nerva.tokensPerS / b.tokensPerS) * 1000) / 1000;
      // llama-bench prints rates, not tokens.
      line.tokens_equal = null;
    } catch (e) {
      line.llama_cpp = { available: false, via: 'llama-bench', reason: (e as Error).message };
    }
    return line;
  }
  if (nerva.backend !== 'cpu') {
    line.llama_cpp = {
      available: false,
      reason: `only node-llama-cpp's CPU build is installed (the workspace leaves its CUDA and Vulkan builds out), so llama.cpp has no ${nerva.backend} peer here; run with --backend cpu, or bring a llama-bench built for the device (--llama-bench PATH)`,
    };
    return line;
  }
  const opened = await openLlamaCpp({ threads: o.threads });
  if (!opened.available) {
    line.llama_cpp = { available: false, reason: opened.reason };
    return line;
  }
  let greedy: LlamaCppGreedyResult;
  try {
    const m = await opened.runtime.load(path, o.promptLen + o.tokens + 16);
    try {
      // Warm-up on the other prompt, as NERVA had.
      await m.greedy(warm, Math.min(o.tokens, 8));
      greedy = await m.greedy(prompt, o.tokens);
    } finally {
      await m.dispose();
    }
  } finally {
    await opened.runtime.dispose();
  }
  const llamaTokS = greedy.tokens.length > 1 && greedy.decodeMs > 0 ? ((greedy.tokens.length - 1) * 1000) / greedy.decodeMs : 0;
  const firstDiff = nerva.tokens.findIndex((t, i) => t !== greedy.tokens[i]);
  const equal = firstDiff < 0 && nerva.tokens.length === greedy.tokens.length;
  const exactTypes = layout.types.every((t) => EXACT_TYPES.has(t));
  line.llama_cpp = {
    available: true,
    version: opened.runtime.version,
    llama_cpp_release: opened.runtime.llamaCppRelease,
    device: 'cpu',
    threads: opened.runtime.threads,
    kv_cache: 'f32',
    tokens_per_s: Math.round(llamaTokS * 100) / 100,
    first_token_ms: round2(greedy.firstTokenMs),
    tokens_sha256: digest(greedy.tokens),
  };
  line.nerva_over_llama_cpp = llamaTokS > 0 ? Math.round((nerva.tokensPerS / llamaTokS) * 1000) / 1000 : null;
  line.tokens_equal = equal;
  line.first_difference = equal ? null : firstDiff < 0 ? Math.min(nerva.tokens.length, greedy.tokens.length) : firstDiff;
  // Where a weight is quantized, llama.cpp quantizes the activations of that matmul too (Q8_0 /
  // Q8_K; bf16 for BF16): after a near-tie the two greedy paths may part.
  line.tokens_equal_expected = exactTypes;
  return line;
}

interface FileLayout {
  fileBytes: number;
  /** ggml types of the file's tensors, most bytes first. */
  types: string[];
  decodeBytesPerToken: number;
}

function fileLayout(f: GgufFile): FileLayout {
  const arch = scalar(f, 'general.architecture');
  const used = Number(scalar(f, `${String(arch)}.expert_used_count`) ?? 0);
  const experts = Number(scalar(f, `${String(arch)}.expert_count`) ?? 0);
  const untiedOutput = f.has('output.weight');
  const byType = new Map<string, number>();
  let perToken = 0;
  for (const t of f.tensors) {
    byType.set(t.type, (byType.get(t.type) ?? 0) + t.byteLength);
    perToken += readPerToken(t, untiedOutput, experts > 0 && used > 0 ? used / experts : 1);
  }
  return {
    fileBytes: f.fileSize,
    types: [...byType].sort((a, b) => b[1] - a[1]).map(([t]) => t),
    decodeBytesPerToken: Math.round(perToken),
  };
}

function readPerToken(t: GgufTensorInfo, untiedOutput: boolean, expertShare: number): number {
  if (t.name === 'token_embd.weight' && untiedOutput) return t.byteLength / t.dims[t.dims.length - 1];
  if (t.name.includes('_exps.')) return t.byteLength * expertShare;
  return t.byteLength;
}

function scalar(f: GgufFile, key: string): unknown {
  const v = f.get(key);
  return v && v.type !== 'ARRAY' ? v.value : undefined;
}

const digest = (ids: readonly number[]): string => createHash('sha256').update(ids.join(',')).digest('hex').slice(0, 16);
const round2 = (x: number | null): number | null => (x === null ? null : Math.round(x * 100) / 100);
