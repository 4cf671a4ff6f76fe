/**
 * Read access to a Linux sysfs/procfs tree. Discovery never touches node:fs directly: it goes
 * through a `SysfsReader`, so tests point it at recorded trees (`test/fixtures/<name>/`) and
 * callers can feed it anything that looks like /sys.
 *
 * Paths are absolute in the tree's own terms ('/sys/bus/pci/devices', '/proc/cmdline'); a reader
 * over a root directory maps them under that root.
 *
 * Symbolic links: sysfs is full of them (`/sys/bus/pci/devices/<bdf>` -> the device's place under
 * `/sys/devices/pci…`). A recorded tree may hold real links, or a manifest file `symlinks.txt` at
 * its root with one `path -> target` line per link (paths relative to the root, targets as
 * `readlink` printed them). Manifest links are followed by the reader itself, and an absolute
 * target is taken relative to the tree's root, so a recorded tree never reaches outside itself.
 * (Real links are followed by the filesystem, so a real link with an absolute target leads to this
 * machine's path; tools/gpu/record_topology.sh writes the manifest instead.)
 */
import { lstatSync, readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { posix } from 'node:path';
import { SysfsReadError, TransportArgumentError } from './errors.js';

/** Read-only access to a sysfs-like tree. Missing paths read as `undefined` (or `false`), never throw. */
export interface SysfsReader {
  /** What the reader reads, for notes and errors ('/' or a fixture directory). */
  readonly description: string;
  /** The file's text (not trimmed), or `undefined` when it is missing or unreadable. */
  readFile(path: string): string | undefined;
  /** The sorted entry names of a directory, or `undefined` when it is not a directory. */
  readdir(path: string): string[] | undefined;
  /** A symbolic link's target as stored, or `undefined` when the path is not a link. */
  readlink(path: string): string | undefined;
  /** Whether the path exists (following links). */
  exists(path: string): boolean;
}

/** Name of the symlink manifest a recorded tree may carry at its root. */
export const SYMLINK_MANIFEST = 'symlinks.txt';

/** Errors that mean "not there / not readable as such" in sysfs, as opposed to a broken reader. */
const ABSENT_CODES = new Set(['ENOENT', 'ENOTDIR', 'EACCES', 'EPERM', 'EINVAL', 'ENODEV', 'EIO', 'ENXIO', 'ELOOP', 'EISDIR']);

function isAbsent(e: unknown): boolean {
  return typeof e === 'object' && e !== null && ABSENT_CODES.has(String((e as { code?: unknown }).code));
}

/** Normalize to an absolute POSIX path without a trailing slash. */
export function normalizeSysPath(path: string): string {
  if (typeof path !== 'string' || path.length === 0) throw new TransportArgumentError(`sysfs path must be a non-empty string`);
  const p = posix.normalize(path.startsWith('/') ? path : `/${path}`);
  return p.length > 1 && p.endsWith('/') ? p.slice(0, -1) : p;
}

/** Parse a `symlinks.txt` manifest: `path -> target` per line, '#' comments, blank lines ignored. */
export function parseSymlinkManifest(text: string): Map<string, string> {
  const links = new Map<string, string>();
  for (const [i, raw] of text.split('\n').entries()) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const at = line.indexOf(' -> ');
    if (at <= 0) throw new TransportArgumentError(`${SYMLINK_MANIFEST} line ${i + 1}: expected "path -> target", got ${JSON.stringify(raw)}`);
    const target = line.slice(at + 4).trim();
    if (target === '') throw new TransportArgumentError(`${SYMLINK_MANIFEST} line ${i + 1}: empty target`);
    links.set(normalizeSysPath(line.slice(0, at).trim()), target);
  }
  return links;
}

/**
 * Follows manifest links: rewrites every prefix of `path` that is a manifest link into its
 * target, until none is left. `keepLast` leaves the final component unresolved (for readlink).
 * Returns `undefined` on a cycle.
 */
function resolveLinks(links: ReadonlyMap<string, string>, path: string, keepLast = false): string | undefined {
  let p = normalizeSysPath(path);
  for (let hops = 0; hops < 64; hops++) {
    const parts = p.split('/').filter(Boolean);
    const limit = keepLast ? parts.length - 1 : parts.length;
    let rewritten = false;
    for (let i = 1; i <= limit; i++) {
      const prefix = `/${parts.slice(0, i).join('/')}`;
      const target = links.get(prefix);
      if (target === undefined) continue;
      const base = target.startsWith('/') ? target : posix.join(posix.dirname(prefix), target);
      p = normalizeSysPath(posix.join(base, ...parts.slice(i)));
      rewritten = true;
      break;
    }
    if (!rewritten) return p;
  }
  return undefined;
}

/** Link names the manifest places directly inside `dir` (after resolving `dir` itself). */
function manifestChildren(links: ReadonlyMap<string, string>, dir: string): string[] {
  const out: string[] = [];
  for (const link of links.keys()) {
    const parent = posix.dirname(link);
    if (parent === dir || resolveLinks(links, parent) === dir) out.push(posix.basename(link));
  }
  return out;
}

/** Whether some manifest link lives at or below `dir` (so `dir` exists implicitly). */
function manifestHasBelow(links: ReadonlyMap<string, string>, dir: string): boolean {
  const prefix = dir === '/' ? '/' : `${dir}/`;
  for (const link of links.keys()) if (link === dir || link.startsWith(prefix)) return true;
  return false;
}

/**
 * A `SysfsReader` over a directory of the real filesystem: '/' for the machine itself, or a
 * recorded tree (with or without a `symlinks.txt` manifest).
 */
export class FsSysfsReader implements SysfsReader {
  readonly description: string;
  readonly root: string;
  private readonly links: ReadonlyMap<string, string>;
  private readonly hasManifest: boolean;

  /**
   * @param root the directory that plays '/', default '/'.
   * @param options.manifest read `<root>/symlinks.txt` when present (default true).
   */
  constructor(root = '/', options: { manifest?: boolean } = {}) {
    this.root = posix.resolve(root);
    this.description = this.root;
    let links = new Map<string, string>();
    const text = options.manifest === false ? undefined : this.rawRead(posix.join(this.root, SYMLINK_MANIFEST));
    if (text !== undefined) links = parseSymlinkManifest(text);
    this.links = links;
    this.hasManifest = text !== undefined;
  }

  private rawRead(real: string): string | undefined {
    try {
      return readFileSync(real, 'utf8');
    } catch (e) {
      if (isAbsent(e)) return undefined;
      throw new SysfsReadError(real, e);
    }
  }

  private real(path: string, keepLast = false): string | undefined {
    const resolved = resolveLinks(this.links, path, keepLast);
    return resolved === undefined ? undefined : posix.join(this.root, resolved);
  }

  readFile(path: string): string | undefined {
    const real = this.real(path);
    return real === undefined ? undefined : this.rawRead(real);
  }

  readdir(path: string): string[] | undefined {
    const resolved = resolveLinks(this.links, path);
    if (resolved === undefined) return undefined;
    let names: string[] | undefined;
    try {
      names = readdirSync(posix.join(this.root, resolved));
    } catch (e) {
      if (!isAbsent(e)) throw new SysfsReadError(posix.join(this.root, resolved), e);
    }
    const extra = manifestChildren(this.links, resolved);
    if (names === undefined && extra.length === 0 && !manifestHasBelow(this.links, resolved)) return undefined;
    const all = new Set([...(names ?? []), ...extra]);
    if (resolved === '/' && this.hasManifest) all.delete(SYMLINK_MANIFEST);
    return [...all].sort();
  }

  readlink(path: string): string | undefined {
    const parentResolved = resolveLinks(this.links, path, true);
    if (parentResolved === undefined) return undefined;
    const fromManifest = this.links.get(parentResolved);
    if (fromManifest !== undefined) return fromManifest;
    try {
      if (!lstatSync(posix.join(this.root, parentResolved)).isSymbolicLink()) return undefined;
      return readlinkSync(posix.join(this.root, parentResolved));
    } catch (e) {
      if (isAbsent(e)) return undefined;
      throw new SysfsReadError(posix.join(this.root, parentResolved), e);
    }
  }

  exists(path: string): boolean {
    const resolved = resolveLinks(this.links, path);
    if (resolved === undefined) return false;
    try {
      statSync(posix.join(this.root, resolved));
      return true;
    } catch (e) {
      if (!isAbsent(e)) throw new SysfsReadError(posix.join(this.root, resolved), e);
    }
    return manifestHasBelow(this.links, resolved);
  }
}

/** The contents of an in-memory tree: files by absolute path, links by absolute path -> target. */
export interface MemoryTree {
  files: Record<string, string>;
  links?: Record<string, string>;
}

/**
 * A `SysfsReader` over an in-memory tree: directories exist implicitly above every file and link.
 * Handy for tests of malformed input and for callers that collect sysfs values some other way.
 */
export class MemorySysfsReader implements SysfsReader {
  readonly description: string;
  private readonly files = new Map<string, string>();
  private readonly links = new Map<string, string>();
  private readonly dirs = new Map<string, Set<string>>();

  constructor(tree: MemoryTree, description = 'memory') {
    this.description = description;
    for (const [p, text] of Object.entries(tree.files)) this.add(normalizeSysPath(p), text, this.files);
    for (const [p, target] of Object.entries(tree.links ?? {})) this.add(normalizeSysPath(p), target, this.links);
  }

  private add(path: string, value: string, into: Map<string, string>): void {
    into.set(path, value);
    let child = path;
    while (child !== '/') {
      const parent = posix.dirname(child);
      let set = this.dirs.get(parent);
      if (!set) this.dirs.set(parent, (set = new Set()));
      set.add(posix.basename(child));
      child = parent;
    }
  }

  readFile(path: string): string | undefined {
    const p = resolveLinks(this.links, path);
    return p === undefined ? undefined : this.files.get(p);
  }

  readdir(path: string): string[] | undefined {
    const p = resolveLinks(this.links, path);
    const set = p === undefined ? undefined : this.dirs.get(p);
    return set ? [...set].sort() : undefined;
  }

  readlink(path: string): string | undefined {
    const p = resolveLinks(this.links, path, true);
    return p === undefined ? undefined : this.links.get(p);
  }

  exists(path: string): boolean {
    const p = resolveLinks(this.links, path);
    return p !== undefined && (this.files.has(p) || this.dirs.has(p));
  }
}

/** A reader over `root` (default '/': this machine). */
export function createSysfsReader(root = '/'): SysfsReader {
  return new FsSysfsReader(root);
}
