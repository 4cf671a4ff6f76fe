/**
 * What the CLI commands share about the model they are given: a `--model` value (a folder, an HF
 * repo id, or a short name found in the HF cache) resolved to a folder before anything loads, the
 * checks a command makes on that folder before the weights load, and the name a server gives it.
 */
import { existsSync } from 'node:fs';
import { basename, dirname, join, sep } from 'node:path';
import { isGgufPath, loadModelTokenizer, NervaTokenizer, readTokenizerJson, resolveModelDir } from '@nerva/models';
import { defaultModelDir } from './default-model.js';
import { ConfigError } from './errors.js';
import { FALLBACK_CHAT_TEMPLATE } from './server.js';

/** The help line of `--model` on the commands that resolve it. */
export const MODEL_FLAG_HELP =
  "model: a folder or a .gguf file (relative to the current directory), an HF repo id (Org/Name) or a short name (qwen3-8b) found in the local HF cache, a GGUF repository's file (Org/Repo-GGUF:Q4_K_M), or an Ollama name (qwen3:8b) of a model Ollama has pulled; default: the embedded model";

/** Folders searched for a bare model name before the HF cache: the embedded model's. */
function searchDirs(): string[] {
  try {
    return [dirname(defaultModelDir())];
  } catch {
    return [];
  }
}

/**
 * The folder of a `--model` value: the embedded model when absent, else per `resolveModelDir`
 * (relative paths against `cwd`, default this process's directory; the HF cache per HF_HUB_CACHE / HF_HOME).
 * Throws ResolveError listing every place it looked.
 */
export async function resolveModelArg(model: string | undefined, cwd = process.cwd()): Promise<string> {
  if (model === undefined) return defaultModelDir();
  return resolveModelDir(model, { cwd, searchDirs: searchDirs() });
}

/** The HF repo id (`Org/Name`) of a folder inside a hub cache snapshot, else undefined. */
export function hubRepoIdOf(dir: string): string | undefined {
  const parts = dir.split(sep);
  const i = parts.lastIndexOf('snapshots');
  if (i < 1 || i !== parts.length - 2) return undefined;
  // Repo ids never hold "--", so the folder name splits into exactly three parts.
  const p = parts[i - 1].split('--');
  return p.length === 3 && p[0] === 'models' && p[1] && p[2] ? `${p[1]}/${p[2]}` : undefined;
}

/** The name clients use for a model folder: its HF repo id for a hub snapshot (whose folder name is a hash), else the folder's name. */
export function modelNameOf(dir: string): string {
  return hubRepoIdOf(dir) ?? basename(dir);
}

/**
 * Fail before the weights load when a command needs text and the model has no tokenizer: the
 * error names the file and what to do instead.
 */
export function requireTokenizer(dir: string, why: string): void {
  // A GGUF file carries its vocabulary (or says it has none: loading then says so).
  if (isGgufPath(dir)) return;
  const path = join(dir, 'tokenizer.json');
  if (!existsSync(path)) throw new ConfigError('model', `${path} is missing: ${why}`);
}

/** A tokenizer for chat: the model's, with the server's plain transcript template where the model ships none. */
export interface ChatTokenizer {
  tokenizer: NervaTokenizer;
  /** True when the model has no chat template and {@link FALLBACK_CHAT_TEMPLATE} renders messages. */
  fallback: boolean;
}

/** The model's tokenizer, given the same template fallback `nerva serve` uses (FALLBACK_CHAT_TEMPLATE) when it has none. */
export async function loadChatTokenizer(dir: string): Promise<ChatTokenizer> {
  const tok = await loadTokenizerOf(dir);
  if (tok.chatTemplate !== undefined) return { tokenizer: tok, fallback: false };
  if (isGgufPath(dir)) return { tokenizer: (await loadModelTokenizer(dir, FALLBACK_CHAT_TEMPLATE))!, fallback: true };
  const json = await readTokenizerJson(dir, 'tokenizer.json', true);
  const cfg = (await readTokenizerJson(dir, 'tokenizer_config.json', false)) ?? {};
  return { tokenizer: new NervaTokenizer(json, cfg, FALLBACK_CHAT_TEMPLATE, join(dir, 'tokenizer.json')), fallback: true };
}

/** The tokenizer of a model folder or GGUF file; a clear error when it has none. */
export async function loadTokenizerOf(model: string): Promise<NervaTokenizer> {
  if (!isGgufPath(model)) return NervaTokenizer.fromDir(model);
  const tok = await loadModelTokenizer(model);
  if (!tok) throw new ConfigError('model', `${model} has no tokenizer (tokenizer.ggml.model is absent or "none")`);
  return tok;
}

/** The note a command prints when it renders chats with the fallback template. */
export const fallbackNote = (dir: string): string =>
  `model ${modelNameOf(dir)} has no chat template; using the plain "ROLE:" transcript template (as nerva serve does)`;
