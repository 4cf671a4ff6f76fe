import { readdir, readFile, stat } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join, resolve as resolvePath } from 'node:path';
import { ResolveError } from './errors.js';

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

export interface ResolveOptions {
  /** Extra directories to look in, before the HF cache: `<dir>/<name>`, `<dir>/<Org>/<Name>`, `<dir>/<Name>`, or an HF cache layout inside `<dir>`. */
  searchDirs?: readonly string[];
  /** Environment to read HF_HUB_CACHE / HF_HOME from (default `process.env`). */
  env?: Readonly<Record<string, string | undefined>>;
}

/** The hub cache directory as huggingface_hub computes it: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. */
export function hfHubCacheDir(env: Readonly<Record<string, string | undefined>> = process.env): string {
  if (env.HF_HUB_CACHE) return env.HF_HUB_CACHE;
  const home = env.HF_HOME ?? join(env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'huggingface');
  return join(home, 'hub');
}

/**
 * Find a local model directory (one holding `config.json`) for a path, a hub repo id such as
 * `Qwen/Qwen3-8B`, or an alias such as `qwen3-8b`. Looks at the path itself, then `searchDirs`,
 * then the Hugging Face cache (`models--Org--Name/snapshots/<rev>/`, preferring the revision
 * `refs/main` names). Never downloads; throws {@link ResolveError} listing every place it looked.
 */
export async function resolveModelDir(nameOrPath: string, opts: ResolveOptions = {}): Promise<string> {
  const searched: string[] = [];
  const tryDir = async (dir: string): Promise<string | undefined> => {
    searched.push(dir);
    return (await isFile(join(dir, 'config.json'))) ? dir : undefined;
  };

  const looksLikePath = nameOrPath.startsWith('/') || nameOrPath.startsWith('.') || nameOrPath.startsWith('~');
  const expanded = nameOrPath.startsWith('~') ? join(homedir(), nameOrPath.slice(1)) : nameOrPath;
  if ((await isDir(expanded)) || looksLikePath) {
    const found = await tryDir(resolvePath(expanded));
    if (found) return found;
    if (looksLikePath) throw new ResolveError(nameOrPath, searched, `"${nameOrPath}" is not a model directory (no config.json)`);
  }

  const alias = MODEL_ALIASES[nameOrPath.toLowerCase()];
  const repoId = alias ?? nameOrPath;
  const names = [...new Set([nameOrPath, repoId])];
  const [org, repo] = repoId.includes('/') ? repoId.split('/', 2) : [undefined, repoId];

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

  const cache = hfHubCacheDir(opts.env ?? process.env);
  if (org) {
    const found = await findSnapshot(cache, org, repo, searched);
    if (found) return found;
  } else {
    searched.push(`${cache} (not searched: "${nameOrPath}" is neither an alias nor an Org/Name repo id; aliases: ${Object.keys(MODEL_ALIASES).join(', ')})`);
  }
  throw new ResolveError(nameOrPath, searched, `model "${nameOrPath}"${alias ? ` (alias of ${alias})` : ''} not found locally`);
}

/** A snapshot of `org/repo` in an HF hub cache: the one `refs/main` names, else the newest with a config.json. */
async function findSnapshot(cacheDir: string, org: string, repo: string, searched: string[]): Promise<string | undefined> {
  const repoDir = join(cacheDir, `models--${org}--${repo}`);
  const snapshots = join(repoDir, 'snapshots');
  searched.push(`${snapshots}/<rev>/`);
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
