/** The in-process engine of `nerva run` and `nerva chat`: model resolved, inputs checked, then a load with progress. */
import { resolve } from 'node:path';
import { Engine, engineOption, type EngineOptions } from '@nerva/engine';
import { checkKvTiers } from './config.js';
import { loadProgress } from './cli-util.js';
import { MODEL_FLAG_HELP, requireTokenizer, resolveModelArg } from './cli-model.js';
import type { FlagPick } from './options.js';

/** Engine flags `nerva run` and `nerva chat` share; `--model` takes names, not only folders. */
export const CLI_ENGINE_FLAGS: readonly FlagPick[] = [
  [engineOption('model'), { help: MODEL_FLAG_HELP }],
  ...(['backend', 'numerics', 'matmulPrecision', 'batchInvariant', 'kvCacheDtype', 'vramBudget', 'hostBudget', 'offloadDir'] as const).map(engineOption),
];

/** A loaded engine and the folder its model came from. */
export interface CliEngine {
  engine: Engine;
  /** The resolved model folder. */
  model: string;
  /** `offloadDir` and `kvOffloadDir`, resolved against the current directory. */
  offloadDir?: string;
  kvOffloadDir?: string;
}

/**
 * Resolve `--model`, check what the command needs of the folder (`needsTokenizer`: why text must
 * be encoded) before any weight loads, then load with progress on stderr and print the engine's
 * notes.
 */
export async function openCliEngine(e: Partial<EngineOptions>, o: { needsTokenizer?: string } = {}): Promise<CliEngine> {
  checkKvTiers(e);
  const model = await resolveModelArg(e.model);
  if (o.needsTokenizer !== undefined) requireTokenizer(model, o.needsTokenizer);
  const offloadDir = e.offloadDir !== undefined ? resolve(e.offloadDir) : undefined;
  const kvOffloadDir = e.kvOffloadDir !== undefined ? resolve(e.kvOffloadDir) : undefined;
  const progress = loadProgress(model);
  const engine = await Engine.create({ ...e, model, offloadDir, kvOffloadDir, onProgress: (p) => progress.onProgress(p) });
  progress.finish();
  for (const n of engine.notes) process.stderr.write(`nerva: ${n}\n`);
  return { engine, model, offloadDir, kvOffloadDir };
}
