import { readdir, readFile, stat } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join, resolve as resolvePath } from 'node:path';
import { NervaError } from '@nerva/core';
import { ResolveError } from './errors.js';
import { ggufFileTypeName, isGgufPath } from './gguf/gguf-model.js';
import { findHubGguf, listHubGguf } from './hub-gguf.js';
import { formatOllamaName, ollamaManifestPath, ollamaManifests, ollamaModelBlob, ollamaModelDirs, OllamaManifestError, parseOllamaName, type OllamaName } from './ollama.js';
import { SafetensorsFile } from './safetensors.js';

/** Short names for well-known hub repositories (case-insensitive). */
export const MODEL_ALIASES: Readonly<Record<string, string>> = {
  'qwen3-0.6b': 'Qwen/Qwen3-0.6B',
  'qwen3-1.7b': 'Qwen/Qwen3-1.7B',
  'qwen3-4b': 'Qwen/Qwen3-4B',
  'qwen3-8b': 'Qwen/Qwen3-8B',
  'qwen3-14b': 'Qwen/Qwen3-14B',
  'qwen3-32b': 'Qwen/Qwen3-32B',
  'qwen3-30b-a3b': 'Qwen/Qwen3-30B-A3B',
  'qwen2.5-0.5b': 'Qwen/Qwen2.5-0.5B',
  'qwen2.5-0.5b-instruct': 'Qwen/Qwen2.5-0.5B-Instruct',
  'llama-3.1-8b': 'meta-llama/Llama-3.1-8B',
  'llama-3.1-8b-instruct': 'meta-llama/Llama-3.1-8B-Instruct',
  'llama-3.2-1b': 'meta-llama/Llama-3.2-1B',
  'llama-3.2-1b-instruct': 'meta-llama/Llama-3.2-1B-Instruct',
  'llama-3.2-3b': 'meta-llama/Llama-3.2-3B',
  'llama-3.2-3b-instruct': 'meta-llama/Llama-3.2-3B-Instruct',
};

type Env = Readonly<Record<string, string | undefined>>;

export interface ResolveOptions {
  /** Extra directories to look in, before the HF cache: `<dir>/<name>`, `<dir>/<Org>/<Name>`, `<dir>/<Name>`, or an HF cache layout inside `<dir>`. */
  searchDirs?: readonly string[];
  /** Environment to read HF_HUB_CACHE / HF_HOME / OLLAMA_MODELS from (default `process.env`). */
  env?: Env;
  /** The directory relative paths resolve against (default `process.cwd()`). */
  cwd?: string;
}

/** A short name matched more than one repository in the cache: the caller must pick one by its `Org/Name`. */
export class AmbiguousModelError extends NervaError {
  constructor(
    readonly query: string,
    /** The matching repo ids, sorted. */
    readonly candidates: readonly string[],
    readonly cacheDir: string,
  ) {
    super('MODEL_AMBIGUOUS', `model "${query}" is ambiguous: ${cacheDir} holds ${candidates.join(', ')}; pass one of these Org/Name ids instead`);
  }
}

const expandHome = (p: string): string => (p === '~' || p.startsWith('~/') ? join(homedir(), p.slice(1)) : p);

/**
 * The hub cache directory as huggingface_hub computes it: $HF_HUB_CACHE (or its older name
 * HUGGINGFACE_HUB_CACHE), else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub.
 */
export function hfHubCacheDir(env: Env = process.env): string {
  const hub = env.HF_HUB_CACHE || env.HUGGINGFACE_HUB_CACHE;
  if (hub) return expandHome(hub);
  const home = env.HF_HOME ? expandHome(env.HF_HOME) : join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'huggingface');
  return join(home, 'hub');
}

/** `Org/Name` as the hub cache names its folder, and back. */
const repoFolder = (repoId: string): string => `models--${repoId.split('/').join('--')}`;
function repoIdOf(folder: string): string | undefined {
  if (!folder.startsWith('models--')) return undefined;
  const parts = folder.slice('models--'.length).split('--');
  return parts.length === 2 && parts.every((p) => p.length > 0) ? parts.join('/') : undefined;
}

/** The repo ids in a hub cache whose name (without the org) is `name`, case-insensitively. */
async function reposNamed(cacheDir: string, name: string): Promise<string[]> {
  let entries: string[];
  try {
    entries = await readdir(cacheDir);
  } catch {
    return [];
  }
  const want = name.toLowerCase();
  return entries
    .map(repoIdOf)
    .filter((id): id is string => id !== undefined && id.split('/')[1].toLowerCase() === want)
    .sort();
}

/**
 * Find a local model directory (one holding `config.json`) or GGUF file for a path, a hub repo id
 * such as `Qwen/Qwen3-8B`, a short name such as `qwen3-8b`, or an Ollama name such as `qwen3:8b`
 * (the GGUF blob Ollama pulled; a name without a tag is tried as Ollama's `:latest` last). Looks at the path itself (relative to
 * `cwd`), then `searchDirs`, then the Hugging Face cache (`models--Org--Name/snapshots/<rev>/`,
 * preferring the revision `refs/main` names). A short name is matched, case-insensitively, against
 * the repository names (without the org) in the cache, then against {@link MODEL_ALIASES}; two
 * repositories of that name are an {@link AmbiguousModelError}. Never downloads; throws
 * {@link ResolveError} listing every place it looked.
 */
export async function resolveModelDir(nameOrPath: string, opts: ResolveOptions = {}): Promise<string> {
  const cwd = opts.cwd ?? process.cwd();
  const searched: string[] = [];
  const tryDir = async (dir: string): Promise<string | undefined> => {
    searched.push(dir);
    return (await isFile(join(dir, 'config.json'))) ? dir : undefined;
  };

  const expanded = expandHome(nameOrPath);
  const local = resolvePath(cwd, expanded);
  // A GGUF file carries everything a model needs: the file itself is the model.
  if ((await isFile(local)) && isGgufPath(local)) return local;
  // A repo id has one slash; anything else with a slash, or starting with . / ~, is a path.
  const slashes = nameOrPath.split('/').length - 1;
  // An Ollama name with a tag may have two slashes (`hf.co/org/repo:tag`).
  const ollama = parseOllamaName(nameOrPath);
  const tagged = ollama !== undefined && /:[^/]+$/.test(nameOrPath);
  const looksLikePath = (/^[./~]/.test(nameOrPath) || slashes > 1 || nameOrPath.includes('\\')) && !tagged;
  if ((await isDir(local)) || looksLikePath) {
    const found = await tryDir(local);
    if (found) return found;
    if (looksLikePath) throw new ResolveError(nameOrPath, searched, `"${nameOrPath}" is not a model directory (no config.json)`);
  } else searched.push(`${local} (no such folder)`);

  // A name with a tag (`qwen3:8b`) is Ollama's: the GGUF blob it pulled.
  const env = opts.env ?? process.env;
  const cache = hfHubCacheDir(env);
  if (tagged) {
    // `Org/Repo:QUANT`: a GGUF repository's file in the HF cache, as llama.cpp's -hf names it.
    const colon = nameOrPath.lastIndexOf(':');
    const repoId = nameOrPath.slice(0, colon);
    if (repoId.split('/').length === 2) {
      const found = await hubGguf(nameOrPath, cache, repoId, nameOrPath.slice(colon + 1), searched);
      if (found) return found;
    }
    const found = await findOllama(nameOrPath, ollama, env, searched);
    if (found) return found;
    throw new ResolveError(nameOrPath, searched, `model "${nameOrPath}" not found among Ollama's models`);
  }

  let repoId: string | undefined = slashes === 1 ? nameOrPath : undefined;
  let via = '';
  if (repoId === undefined) {
    const inCache = await reposNamed(cache, nameOrPath);
    if (inCache.length > 1) throw new AmbiguousModelError(nameOrPath, inCache, cache);
    repoId = inCache[0] ?? MODEL_ALIASES[nameOrPath.toLowerCase()];
    if (repoId !== undefined && inCache.length === 0) via = ` (alias of ${repoId})`;
  }
  const names = [...new Set([nameOrPath, ...(repoId ? [repoId] : [])])];
  const [org, repo] = repoId ? repoId.split('/', 2) : [undefined, nameOrPath];

  for (const base of opts.searchDirs ?? []) {
    for (const n of names) {
      const found = await tryDir(join(base, n));
      if (found) return found;
    }
    if (org) {
      const found = (await tryDir(join(base, repo))) ?? (await findSnapshot(base, org, repo, searched));
      if (found) return found;
    }
  }

  if (org) {
    const found = (await findSnapshot(cache, org, repo, searched)) ?? (await hubGguf(nameOrPath, cache, `${org}/${repo}`, undefined, searched));
    if (found) return found;
  } else {
    searched.push(`${cache} (no repository named "${nameOrPath}" there, and it is no known alias: ${Object.keys(MODEL_ALIASES).join(', ')})`);
  }
  // Without a tag, Ollama's `latest`.
  if (ollama) {
    const found = await findOllama(nameOrPath, ollama, env, searched);
    if (found) return found;
  }
  throw new ResolveError(nameOrPath, searched, `model "${nameOrPath}"${via} not found locally`);
}

/** The file a GGUF repository of the HF cache has for `tag` (undefined: no such repository); an error when it has files but none or several answer. */
async function hubGguf(query: string, cache: string, repoId: string, tag: string | undefined, searched: string[]): Promise<string | undefined> {
  const repoDir = join(cache, repoFolder(repoId));
  searched.push(`${join(repoDir, 'snapshots')}/<rev>/ (a .gguf file${tag ? ` of ${tag}` : ''})`);
  const m = await findHubGguf(repoDir, tag);
  if (m && 'problem' in m) throw new ResolveError(query, searched, m.problem);
  return m?.file.path;
}

/** The blob of Ollama model `n` in the first models folder holding its manifest; a broken manifest is an error. */
async function findOllama(query: string, n: OllamaName, env: Readonly<Record<string, string | undefined>>, searched: string[]): Promise<string | undefined> {
  for (const dir of ollamaModelDirs(env)) {
    const manifest = ollamaManifestPath(dir, n);
    searched.push(manifest);
    if (!(await isFile(manifest))) continue;
    try {
      return (await ollamaModelBlob(dir, manifest)).path;
    } catch (e) {
      if (e instanceof OllamaManifestError) throw new ResolveError(query, searched, e.message);
      throw e;
    }
  }
  return undefined;
}

/** The snapshot folder of `org/repo` in an HF hub cache: the one `refs/main` names, else the newest with a config.json. */
async function findSnapshot(cacheDir: string, org: string, repo: string, searched?: string[]): Promise<string | undefined> {
  const repoDir = join(cacheDir, repoFolder(`${org}/${repo}`));
  const snapshots = join(repoDir, 'snapshots');
  searched?.push(`${snapshots}/<rev>/`);
  let revs: string[];
  try {
    revs = await readdir(snapshots);
  } catch {
    return undefined;
  }
  try {
    const main = (await readFile(join(repoDir, 'refs', 'main'), 'utf8')).trim();
    if (revs.includes(main) && (await isFile(join(snapshots, main, 'config.json')))) return join(snapshots, main);
  } catch {
    // No refs/main: fall back to the newest usable snapshot.
  }
  let best: { dir: string; mtime: number } | undefined;
  for (const rev of revs) {
    const dir = join(snapshots, rev);
    try {
      const s = await stat(join(dir, 'config.json'));
      if (!best || s.mtimeMs > best.mtime) best = { dir, mtime: s.mtimeMs };
    } catch {
      // Snapshot without config.json: incomplete download.
    }
  }
  return best?.dir;
}

/** A model found by {@link listLocalModels}. */
export interface LocalModel {
  /** `Org/Name` for a hub cache entry, else the folder's name. */
  name: string;
  /** The folder a `--model` of `name` resolves to. */
  path: string;
  /** Bytes of the files in it (symlinks followed, as the hub cache links its blobs). */
  bytes: number;
  /** The weights' dtype: config.json's `torch_dtype`/`dtype`, else the safetensors headers'; a GGUF file's type (`Q4_K_M`); undefined when none says. */
  dtype?: string;
  /** Where it was found: the hub cache, one of the search folders, or Ollama's models (`path` is the GGUF blob). */
  source: 'hub-cache' | 'search-dir' | 'ollama';
}

/**
 * The models on this machine: every repository of the hub cache with a usable snapshot (as
 * {@link resolveModelDir} would pick it), every folder with a `config.json` directly inside
 * `searchDirs`, and every model Ollama has pulled (by Ollama's name). Sorted by name. Reads only directory listings, config.json and at most one
 * safetensors header per model.
 */
export async function listLocalModels(opts: Omit<ResolveOptions, 'cwd'> = {}): Promise<LocalModel[]> {
  const out: LocalModel[] = [];
  const env = opts.env ?? process.env;
  const cache = hfHubCacheDir(env);
  for (const entry of await readdirOrEmpty(cache)) {
    const id = repoIdOf(entry);
    if (!id) continue;
    const [org, repo] = id.split('/');
    const dir = await findSnapshot(cache, org, repo);
    if (dir) out.push({ name: id, path: dir, ...(await describeDir(dir)), source: 'hub-cache' });
    // A GGUF repository: each of its files, by the name that picks it.
    else for (const f of await listHubGguf(join(cache, entry))) out.push({ name: `${id}:${f.tag}`, path: f.path, bytes: f.bytes, ...(await ggufDtype(f.path)), source: 'hub-cache' });
  }
  for (const base of opts.searchDirs ?? []) {
    for (const entry of await readdirOrEmpty(base)) {
      const dir = join(base, entry);
      if (await isFile(join(dir, 'config.json'))) out.push({ name: entry, path: dir, ...(await describeDir(dir)), source: 'search-dir' });
    }
  }
  for (const dir of ollamaModelDirs(env)) {
    for (const { name, manifest } of await ollamaManifests(dir)) {
      // A manifest without a usable model blob (an embedding-only or broken pull) is not listed; naming it says why.
      const blob = await ollamaModelBlob(dir, manifest).catch(() => undefined);
      if (blob) out.push({ name: formatOllamaName(name), path: blob.path, bytes: blob.bytes, ...(await ggufDtype(blob.path)), source: 'ollama' });
    }
  }
  return out.sort((a, b) => a.name.localeCompare(b.name));
}

/** A GGUF file's type as the DTYPE `nerva list` shows (`Q4_K_M`), absent when the file does not open. */
async function ggufDtype(path: string): Promise<{ dtype?: string }> {
  const t = await ggufFileTypeName(path);
  return t === undefined ? {} : { dtype: t };
}

async function describeDir(dir: string): Promise<{ bytes: number; dtype?: string }> {
  let bytes = 0;
  const files = await readdirOrEmpty(dir);
  for (const f of files) {
    try {
      const s = await stat(join(dir, f));
      if (s.isFile()) bytes += s.size;
    } catch {
      // A dangling link (a blob not downloaded): counts nothing.
    }
  }
  let dtype: string | undefined;
  try {
    const cfg = JSON.parse(await readFile(join(dir, 'config.json'), 'utf8')) as { torch_dtype?: unknown; dtype?: unknown };
    const d = cfg.torch_dtype ?? cfg.dtype;
    if (typeof d === 'string') dtype = d;
  } catch {
    // Unreadable config: no dtype from it.
  }
  const first = files.filter((f) => f.endsWith('.safetensors')).sort()[0];
  if (dtype === undefined && first !== undefined) {
    try {
      const st = await SafetensorsFile.open(join(dir, first));
      try {
        const dtypes = [...new Set(st.names().map((n) => st.info(n).dtype))];
        dtype = dtypes.join('+');
      } finally {
        await st.close();
      }
    } catch {
      // A malformed or missing shard: listed without a dtype; loading it names the problem.
    }
  }
  return dtype === undefined ? { bytes } : { bytes, dtype };
}

async function readdirOrEmpty(dir: string): Promise<string[]> {
  try {
    return await readdir(dir);
  } catch {
    return [];
  }
}

async function isFile(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isFile();
  } catch {
    return false;
  }
}

async function isDir(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isDirectory();
  } catch {
    return false;
  }
}
