/**
 * Models Ollama has pulled, by Ollama's names: `qwen3:8b`, `library/qwen3:8b`,
 * `hf.co/bartowski/Qwen3-8B-GGUF:Q4_K_M`. Ollama keeps each as a manifest
 * (`manifests/<host>/<namespace>/<model>/<tag>`, an OCI image manifest) whose layer of media type
 * `application/vnd.ollama.image.model` names a content-addressed blob (`blobs/sha256-<hex>`):
 * the GGUF file itself, which carries the tokenizer and chat template NERVA reads. Nothing is
 * downloaded; the blob is read in place.
 */
import { readdir, readFile, stat } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join } from 'node:path';

type Env = Readonly<Record<string, string | undefined>>;

const DEFAULT_HOST = 'registry.ollama.ai';
const DEFAULT_NAMESPACE = 'library';
const DEFAULT_TAG = 'latest';
const MODEL_LAYER = 'application/vnd.ollama.image.model';

/** An Ollama model name's parts, defaults filled in. */
export interface OllamaName {
  readonly host: string;
  readonly namespace: string;
  readonly model: string;
  readonly tag: string;
}

/**
 * The parts of an Ollama name `[host/][namespace/]model[:tag]`, or undefined for something that
 * is no such name (empty parts, more than three, characters Ollama does not allow).
 */
export function parseOllamaName(name: string): OllamaName | undefined {
  const colon = name.lastIndexOf(':');
  const path = colon >= 0 && !name.slice(colon).includes('/') ? name.slice(0, colon) : name;
  const tag = path === name ? DEFAULT_TAG : name.slice(colon + 1);
  const parts = path.split('/');
  const ok = (s: string) => /^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(s);
  if (parts.length > 3 || !parts.every(ok) || !ok(tag)) return undefined;
  const model = parts.at(-1)!;
  const namespace = parts.length >= 2 ? parts.at(-2)! : DEFAULT_NAMESPACE;
  const host = parts.length === 3 ? parts[0] : DEFAULT_HOST;
  return { host, namespace, model, tag };
}

/** How `nerva list` shows a name: Ollama's own short form (the default host and namespace left out). */
export function formatOllamaName(n: OllamaName): string {
  const path = n.host !== DEFAULT_HOST ? `${n.host}/${n.namespace}/${n.model}` : n.namespace !== DEFAULT_NAMESPACE ? `${n.namespace}/${n.model}` : n.model;
  return `${path}:${n.tag}`;
}

/**
 * The folders Ollama keeps models in, in the order looked at: `$OLLAMA_MODELS` when set, else
 * `~/.ollama/models` and the Linux service's `/usr/share/ollama/.ollama/models`.
 */
export function ollamaModelDirs(env: Env = process.env): string[] {
  if (env.OLLAMA_MODELS) return [env.OLLAMA_MODELS];
  return [join(homedir(), '.ollama', 'models'), '/usr/share/ollama/.ollama/models'];
}

/** The manifest file of `n` under a models folder. */
export function ollamaManifestPath(dir: string, n: OllamaName): string {
  return join(dir, 'manifests', n.host, n.namespace, n.model, n.tag);
}

/** True for the path of a blob in an Ollama models folder (`.../blobs/sha256-<hex>`), whose file name says nothing of the model. */
export function isOllamaBlob(path: string): boolean {
  return /[/\\]blobs[/\\]sha256-[0-9a-f]{64}$/.test(path);
}

/** Why a manifest gave no model, for the resolver's list of places looked at. */
export class OllamaManifestError extends Error {}

/**
 * The GGUF blob a manifest names: its model layer's `sha256:<hex>` digest under `blobs/`, which
 * must exist with the layer's size. Throws {@link OllamaManifestError} naming what is wrong.
 */
export async function ollamaModelBlob(dir: string, manifestPath: string): Promise<{ path: string; bytes: number }> {
  let doc: unknown;
  try {
    doc = JSON.parse(await readFile(manifestPath, 'utf8'));
  } catch (e) {
    throw new OllamaManifestError(`${manifestPath}: not a readable JSON manifest (${(e as Error).message})`);
  }
  const layers = (doc as { layers?: unknown } | null)?.layers;
  if (!Array.isArray(layers)) throw new OllamaManifestError(`${manifestPath}: no "layers" list`);
  const layer = layers.find((l: { mediaType?: unknown }) => l?.mediaType === MODEL_LAYER) as { digest?: unknown; size?: unknown } | undefined;
  if (!layer) throw new OllamaManifestError(`${manifestPath}: no layer of type ${MODEL_LAYER} (not a language model)`);
  const m = typeof layer.digest === 'string' ? /^sha256:([0-9a-f]{64})$/.exec(layer.digest) : null;
  if (!m) throw new OllamaManifestError(`${manifestPath}: the model layer's digest ${JSON.stringify(layer.digest)} is not sha256:<64 hex digits>`);
  const path = join(dir, 'blobs', `sha256-${m[1]}`);
  let size: number;
  try {
    size = (await stat(path)).size;
  } catch {
    throw new OllamaManifestError(`${path}: the model blob the manifest names is missing (pull the model again)`);
  }
  if (typeof layer.size === 'number' && layer.size !== size) {
    throw new OllamaManifestError(`${path}: ${size} bytes, the manifest says ${layer.size} (an interrupted pull?)`);
  }
  return { path, bytes: size };
}

/** Every model pulled into `dir`: its name and manifest path. */
export async function ollamaManifests(dir: string): Promise<{ name: OllamaName; manifest: string }[]> {
  const out: { name: OllamaName; manifest: string }[] = [];
  const ls = async (p: string) => readdir(p).catch(() => [] as string[]);
  const root = join(dir, 'manifests');
  for (const host of await ls(root))
    for (const namespace of await ls(join(root, host)))
      for (const model of await ls(join(root, host, namespace)))
        for (const tag of await ls(join(root, host, namespace, model))) {
          const manifest = join(root, host, namespace, model, tag);
          if ((await stat(manifest).catch(() => undefined))?.isFile()) out.push({ name: { host, namespace, model, tag }, manifest });
        }
  return out;
}

const PARAMS_LAYER = 'application/vnd.ollama.image.params';

/** Ollama's parameter names → generation_config.json's. */
const PARAM_KEYS: Readonly<Record<string, string>> = {
  temperature: 'temperature',
  top_k: 'top_k',
  top_p: 'top_p',
  min_p: 'min_p',
  repeat_penalty: 'repetition_penalty',
};

/** What a pull's `params` layer sets: generation_config.json keys, and the stop strings. */
export interface OllamaParams {
  readonly generationConfig: Record<string, number>;
  readonly stop: readonly string[];
}

/**
 * The generation settings Ollama keeps beside the model blob `blob` (its manifest's `params`
 * layer): the sampling numbers Ollama would default to, and its stop strings. Undefined when no
 * manifest of its models folder names the blob, when those that do carry different params, or
 * when the params are absent or unreadable (the model then runs on the GGUF's own defaults).
 */
export async function ollamaParamsOf(blob: string): Promise<OllamaParams | undefined> {
  if (!isOllamaBlob(blob)) return undefined;
  const dir = join(blob, '..', '..');
  const digest = `sha256:${blob.slice(-64)}`;
  const params = new Set<string>();
  for (const { manifest } of await ollamaManifests(dir)) {
    // A manifest that does not read or parse names nothing here (naming its model says what is wrong).
    const layers = await readFile(manifest, 'utf8').then(
      (t) => {
        try {
          return (JSON.parse(t) as { layers?: unknown } | null)?.layers;
        } catch {
          return undefined;
        }
      },
      () => undefined,
    );
    if (!Array.isArray(layers) || !layers.some((l: { mediaType?: unknown; digest?: unknown }) => l?.mediaType === MODEL_LAYER && l.digest === digest)) continue;
    const p = layers.find((l: { mediaType?: unknown }) => l?.mediaType === PARAMS_LAYER) as { digest?: unknown } | undefined;
    params.add(typeof p?.digest === 'string' ? p.digest : '');
  }
  const [only] = params;
  if (params.size !== 1 || !/^sha256:[0-9a-f]{64}$/.test(only)) return undefined;
  let doc: unknown;
  try {
    doc = JSON.parse(await readFile(join(dir, 'blobs', only.replace(':', '-')), 'utf8'));
  } catch {
    return undefined;
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) return undefined;
  const generationConfig: Record<string, number> = {};
  for (const [k, v] of Object.entries(doc)) if (PARAM_KEYS[k] && typeof v === 'number' && Number.isFinite(v)) generationConfig[PARAM_KEYS[k]] = v;
  const stopValue = (doc as { stop?: unknown }).stop;
  const stop = (Array.isArray(stopValue) ? stopValue : [stopValue]).filter((s): s is string => typeof s === 'string' && s.length > 0);
  return { generationConfig, stop };
}
