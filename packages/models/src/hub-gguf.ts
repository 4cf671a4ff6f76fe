/**
 * GGUF repositories in the Hugging Face cache (`bartowski/Qwen3-8B-GGUF`, `unsloth/...`): one
 * snapshot holding a file per quantization (`Qwen3-8B-Q4_K_M.gguf`, a large one in splits, maybe
 * in a folder of its own). As llama.cpp's `-hf org/repo:QUANT` does, `org/repo:Q4_K_M` names the
 * file of that quantization, and `org/repo` alone the only file, else the Q4_K_M one.
 */
import { readdir, readFile, stat } from 'node:fs/promises';
import { join, relative } from 'node:path';

/** A model file of a GGUF repository: the file to open (a split model's first) and what it holds. */
export interface HubGgufFile {
  /** Its quantization as the file name says it (`Q4_K_M`, `IQ4_XS`, `BF16`...): the tag that names it. */
  readonly tag: string;
  readonly path: string;
  /** Bytes of the file, or of all its splits. */
  readonly bytes: number;
}

/** llama.cpp's default quantization when a repository is named without one. */
const DEFAULT_TAG = 'Q4_K_M';
const SPLIT = /-(\d{5})-of-(\d{5})\.gguf$/i;

/** The snapshot of `repoDir` (`models--Org--Name`) holding GGUF files: the one `refs/main` names, else the newest. */
async function ggufSnapshot(repoDir: string): Promise<string | undefined> {
  const snapshots = join(repoDir, 'snapshots');
  const revs = await readdir(snapshots).catch(() => [] as string[]);
  const main = await readFile(join(repoDir, 'refs', 'main'), 'utf8').then((s) => s.trim(), () => undefined);
  let best: { dir: string; mtime: number } | undefined;
  for (const rev of revs) {
    const dir = join(snapshots, rev);
    if ((await modelFiles(dir)).length === 0) continue;
    if (rev === main) return dir;
    const mtime = (await stat(dir)).mtimeMs;
    if (!best || mtime > best.mtime) best = { dir, mtime };
  }
  return best?.dir;
}

/**
 * The model files of a snapshot: `.gguf` files at its top or one folder down, a split model
 * counted once (its first file, its splits' bytes summed), vision projectors (`mmproj`) left out.
 */
async function modelFiles(dir: string): Promise<HubGgufFile[]> {
  const names: string[] = [];
  for (const e of await readdir(dir).catch(() => [] as string[])) {
    if (/\.gguf$/i.test(e)) names.push(e);
    else if ((await stat(join(dir, e)).catch(() => undefined))?.isDirectory()) {
      for (const f of await readdir(join(dir, e)).catch(() => [] as string[])) if (/\.gguf$/i.test(f)) names.push(join(e, f));
    }
  }
  const out: HubGgufFile[] = [];
  for (const name of names.sort()) {
    const base = name.split(/[/\\]/).pop()!;
    if (/^mmproj/i.test(base)) continue;
    const split = SPLIT.exec(base);
    if (split && Number(split[1]) !== 1) continue;
    let bytes = 0;
    const parts = split ? Array.from({ length: Number(split[2]) }, (_, i) => name.replace(SPLIT, `-${String(i + 1).padStart(5, '0')}-of-${split[2]}.gguf`)) : [name];
    for (const p of parts) bytes += (await stat(join(dir, p)).catch(() => undefined))?.size ?? 0;
    const stem = base.replace(SPLIT, '').replace(/\.gguf$/i, '');
    out.push({ tag: stem.split(/[-.]/).pop()!, path: join(dir, name), bytes });
  }
  return out;
}

/** Whether file `f` answers to `tag`: its name ends in it (after `-`, `.` or `_`), or its folder is named it. */
function answers(f: HubGgufFile, dir: string, tag: string): boolean {
  const rel = relative(dir, f.path);
  const stem = rel.split(/[/\\]/).pop()!.replace(SPLIT, '').replace(/\.gguf$/i, '').toLowerCase();
  const t = tag.toLowerCase();
  const folder = rel.includes('/') || rel.includes('\\') ? rel.split(/[/\\]/)[0].toLowerCase() : undefined;
  const suffix = stem.endsWith(t) && /[-._]$/.test(stem.slice(0, stem.length - t.length));
  return stem === t || suffix || folder === t || folder?.endsWith(`-${t}`) === true;
}

/** What {@link findHubGguf} found: the file, or why none is named (files but no match, several matches). */
export type HubGgufMatch = { readonly file: HubGgufFile } | { readonly problem: string } | undefined;

/**
 * The GGUF file `tag` names in repository `repoDir` (an HF cache `models--Org--Name` folder), or
 * without a tag its only file, else its Q4_K_M one. Undefined when the repository has no GGUF
 * snapshot; a `problem` when it has files but the name picks none or several.
 */
export async function findHubGguf(repoDir: string, tag: string | undefined): Promise<HubGgufMatch> {
  const dir = await ggufSnapshot(repoDir);
  if (!dir) return undefined;
  const files = await modelFiles(dir);
  const tags = files.map((f) => relative(dir, f.path)).join(', ');
  const want = tag ?? (files.length === 1 ? undefined : DEFAULT_TAG);
  const hits = want === undefined ? files : files.filter((f) => answers(f, dir, want));
  if (hits.length === 1) return { file: hits[0] };
  if (hits.length === 0) return { problem: `${dir} holds no ${want} file (${tags}); name one with :QUANT` };
  return { problem: `"${want}" names several files in ${dir} (${hits.map((f) => relative(dir, f.path)).join(', ')})` };
}

/** Every model file of the GGUF snapshot of `repoDir`. */
export async function listHubGguf(repoDir: string): Promise<HubGgufFile[]> {
  const dir = await ggufSnapshot(repoDir);
  return dir ? modelFiles(dir) : [];
}
