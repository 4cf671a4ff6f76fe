import { closeSync, openSync, readSync, statSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import type { LoadedModel, LoadModelOptions } from '../loaded-model.js';
import { NervaTokenizer } from '../tokenizer.js';
import { resolveWeights, type ResolvedWeights } from '../weights.js';
import { GgufCheckpoint } from './gguf-checkpoint.js';
import { GGUF_FILE_TYPES } from '@nerva/core';
import { GgufError } from './gguf-error.js';
import { GgufFile } from './gguf-file.js';
import { ollamaParamsOf } from '../ollama.js';
import { GGUF_MAGIC } from './gguf-header.js';
import type { GgufMetadata } from './gguf-value.js';
import { ggufGenerationConfig } from './gguf-spec.js';
import { ggufTokenizerParts } from './gguf-tokenizer.js';

/**
 * True when `path` names a GGUF model file rather than a model folder: by its `.gguf` extension,
 * or, for a file named otherwise (an Ollama blob, `sha256-...`), by its first bytes being GGUF's
 * magic.
 */
export function isGgufPath(path: string): boolean {
  if (path.toLowerCase().endsWith('.gguf')) return true;
  let fd: number | undefined;
  try {
    if (!statSync(path).isFile()) return false;
    fd = openSync(path, 'r');
    const magic = Buffer.alloc(4);
    return readSync(fd, magic, 0, 4, 0) === 4 && magic.readUInt32LE(0) === GGUF_MAGIC;
  } catch {
    return false;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/**
 * The name of a GGUF file's `general.file_type` (`Q4_K_M`, `F16`...), as `nerva list` shows it;
 * `gguf` when the file does not say or says a type without a name here; undefined when the file
 * does not open.
 */
export async function ggufFileTypeName(path: string): Promise<string | undefined> {
  let f: GgufFile;
  try {
    f = await GgufFile.open(path);
  } catch {
    return undefined;
  }
  try {
    const v = f.get('general.file_type');
    const n = v && v.type !== 'ARRAY' ? Number(v.value) : NaN;
    const name = Object.entries(GGUF_FILE_TYPES).find(([, id]) => id === n)?.[0];
    return name ? name.replace(/^(MOSTLY|ALL)_/, '') : 'gguf';
  } finally {
    await f.close();
  }
}

/**
 * The tokenizer a GGUF file's metadata describes (chat template included), or undefined when it
 * has none. Throws {@link GgufError} UNSUPPORTED_TOKENIZER / BAD_METADATA, or a
 * `TokenizerError` when the vocabulary does not build.
 */
export function ggufTokenizer(metadata: GgufMetadata, path: string): NervaTokenizer | undefined {
  const parts = ggufTokenizerParts(metadata, path);
  if (!parts) return undefined;
  return new NervaTokenizer(parts.tokenizerJson, parts.tokenizerConfig, parts.chatTemplate, path);
}

/**
 * Load a `.gguf` model file: spec, tokenizer, chat template, generation defaults and stop ids all
 * from its metadata (for a blob Ollama pulled, its sampling settings and single-token stop strings
 * over them), weights through a {@link GgufCheckpoint}. Reads the header only (and the tiny
 * `rope_freqs` tensor when present).
 */
export async function loadGgufModel(path: string, opts: LoadModelOptions = {}): Promise<LoadedModel> {
  try {
    if (!(await stat(path)).isFile()) throw new GgufError('IO', path, 'not a regular file');
  } catch (e) {
    if (e instanceof GgufError) throw e;
    throw new GgufError('NOT_FOUND', path, `cannot read: ${(e as Error).message}`, {}, { cause: e });
  }
  const checkpoint = await GgufCheckpoint.open(path);
  try {
    const { spec } = checkpoint;
    const metadata = checkpoint.file.metadata;
    const tokenizer = opts.tokenizer !== false ? ggufTokenizer(metadata, path) : undefined;
    // A model Ollama pulled runs on the settings Ollama keeps for it, over the file's own.
    const ollama = await ollamaParamsOf(path);
    const ggufConfig = ggufGenerationConfig(metadata, path);
    const fromOllama = ollama?.generationConfig ?? {};
    // Ollama's temperature also decides whether to sample at all (HF's do_sample, which the file may carry).
    const sampling = fromOllama.temperature !== undefined ? { do_sample: fromOllama.temperature > 0 } : {};
    const generationConfig = Object.keys(fromOllama).length > 0 ? { ...ggufConfig, ...fromOllama, ...sampling } : ggufConfig;
    const weights: ResolvedWeights = resolveWeights(spec, checkpoint);
    const stop = new Set<number>(spec.eosTokenIds);
    const genEos = generationConfig?.eos_token_id;
    for (const id of Array.isArray(genEos) ? genEos : [genEos]) if (Number.isInteger(id)) stop.add(id as number);
    // llama.cpp's end-of-turn ids stop generation too.
    for (const key of ['tokenizer.ggml.eos_token_id', 'tokenizer.ggml.eot_token_id', 'tokenizer.ggml.eom_token_id']) {
      const v = metadata.get(key);
      if (v && v.type !== 'ARRAY' && v.type !== 'STRING' && v.type !== 'BOOL') {
        const id = Number(v.value);
        if (Number.isSafeInteger(id) && id >= 0 && id < spec.vocabSize) stop.add(id);
      }
    }
    for (const id of tokenizer?.eosTokenIds ?? []) stop.add(id);
    // Ollama's stop strings that are one token of the vocabulary (`<|im_end|>`) stop as that token.
    if (ollama && ollama.stop.length > 0) {
      const tokens = metadata.get('tokenizer.ggml.tokens');
      const list = tokens?.type === 'ARRAY' && tokens.value.itemType === 'STRING' ? (tokens.value.items as readonly string[]) : [];
      for (const s of ollama.stop) {
        const id = list.indexOf(s);
        if (id >= 0 && id < spec.vocabSize) stop.add(id);
      }
    }
    const out: LoadedModel = { dir: path, spec, checkpoint, weights, stopTokenIds: [...stop] };
    if (tokenizer) out.tokenizer = tokenizer;
    if (generationConfig) out.generationConfig = generationConfig;
    return out;
  } catch (e) {
    await checkpoint.close().catch(() => undefined);
    throw e;
  }
}
