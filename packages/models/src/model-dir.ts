import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { Checkpoint } from './checkpoint.js';
import { isGgufPath, loadGgufModel } from './gguf/gguf-model.js';
import { loadModelConfig } from './config.js';
import { ConfigError } from './errors.js';
import { readOptionalModelText } from './model-file.js';
import type { LoadedModel, LoadModelOptions } from './loaded-model.js';
import { NervaTokenizer } from './tokenizer.js';
import { resolveWeights, type ResolvedWeights } from './weights.js';

export type { LoadedModel, LoadModelOptions } from './loaded-model.js';

/**
 * Load a model directory: `config.json` → {@link ModelSpec}, the checkpoint (validated and its
 * tensors resolved against the spec), the tokenizer and `generation_config.json` when present.
 * A path ending in `.gguf` is loaded as a GGUF file instead, everything from its metadata (see
 * {@link loadGgufModel}). Reads headers only; no tensor data is read.
 */
export async function loadModelDir(dir: string, opts: LoadModelOptions = {}): Promise<LoadedModel> {
  if (isGgufPath(dir)) return loadGgufModel(dir, opts);
  const spec = await loadModelConfig(dir);
  const generationConfig = await readOptionalJson(dir, 'generation_config.json');
  const tokenizer =
    opts.tokenizer !== false && (await exists(join(dir, 'tokenizer.json'))) ? await NervaTokenizer.fromDir(dir) : undefined;
  const checkpoint = await Checkpoint.open(dir);
  let weights: ResolvedWeights;
  try {
    weights = resolveWeights(spec, checkpoint);
  } catch (e) {
    await checkpoint.close();
    throw e;
  }
  const stop = new Set<number>(spec.eosTokenIds);
  const genEos = generationConfig?.eos_token_id;
  for (const id of Array.isArray(genEos) ? genEos : [genEos]) if (Number.isInteger(id)) stop.add(id as number);
  for (const id of tokenizer?.eosTokenIds ?? []) stop.add(id);
  const out: LoadedModel = { dir, spec, checkpoint, weights, stopTokenIds: [...stop] };
  if (tokenizer) out.tokenizer = tokenizer;
  if (generationConfig) out.generationConfig = generationConfig;
  return out;
}

async function exists(p: string): Promise<boolean> {
  try {
    await stat(p);
    return true;
  } catch {
    return false;
  }
}

async function readOptionalJson(dir: string, name: string): Promise<Record<string, unknown> | undefined> {
  const path = join(dir, name);
  const text = await readOptionalModelText(dir, name);
  if (text === undefined) return undefined;
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new ConfigError('NOT_JSON', path, `not valid JSON: ${(e as Error).message}`);
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw new ConfigError('NOT_JSON', path, 'not a JSON object');
  return json as Record<string, unknown>;
}
