/**
 * NCCL point-to-point between CUDA backends, for a stage pipeline: hidden states leave one GPU
 * with send() and arrive on the next with recv(), each on a stream of its own backend.
 *
 * libnccl.so.2 is loaded at run time by the addon (native/nccl_dl.cc), never on import, from
 * NERVA_NCCL_PATH (the library or its directory), the loader's search path, then the
 * directories of ncclCandidateDirs() (pip's nvidia-nccl wheels). Nothing NCCL-specific leaves
 * this package: other packages see the backend contract only.
 */
import { existsSync, readdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { DType, DeviceBuffer, StreamHandle } from '@nerva/core';
import { CudaBackend, cudaBackendInternals, type CudaBackendInternals } from './backend.js';
import { CudaArgumentError, NcclUnavailableError, fromNativeNccl } from './errors.js';
import { loadAddon, type NativeAddon, type NativeNccl, type NativeNcclCommInfo } from './native.js';

/** NCCL element types (ncclDataType_t); their codes come from the addon (native/nccl_dl.h). */
export type NcclDataTypeName = 'int8' | 'uint8' | 'int32' | 'uint32' | 'int64' | 'uint64' | 'float16' | 'float32' | 'float64' | 'bfloat16';

/** The NCCL element type a buffer of each dtype travels as. */
export const NCCL_DTYPE_OF: Readonly<Partial<Record<DType, NcclDataTypeName>>> = Object.freeze({
  f32: 'float32',
  bf16: 'bfloat16',
  f16: 'float16',
  i32: 'int32',
});

/** Bytes of an ncclUniqueId. */
export const NCCL_UNIQUE_ID_BYTES = 128;

/** What loadNccl found. */
export interface NcclStatus {
  available: boolean;
  /** Library version, e.g. "2.28.3". */
  version?: string;
  /** ncclGetVersion's code, e.g. 22803. */
  versionCode?: number;
  /** The file the loader mapped. */
  path?: string;
  /** Whether the library has ncclCommInitAll (NcclCommunicator.initAll falls back to per-rank init without it). */
  initAll?: boolean;
  /** Why not, when unavailable. */
  reason?: string;
}

export interface LoadNcclOptions {
  /** Path of nerva_cuda.node (default as for createCudaBackend). */
  addonPath?: string;
  /** Directories holding libnccl.so.2, tried after NERVA_NCCL_PATH and the loader's search (default: ncclCandidateDirs()). */
  candidateDirs?: readonly string[];
}

const NO_NCCL_BUILD = 'the CUDA addon was built without NCCL support; rebuild it with `pnpm build:cuda`';

function pythonLibDirs(prefix: string): string[] {
  const lib = path.join(prefix, 'lib');
  let names: string[];
  try {
    names = readdirSync(lib);
  } catch {
    return [];
  }
  return names
    .filter((n) => /^python3(\.\d+)?$/.test(n))
    .sort()
    .reverse()
    .flatMap((n) => [path.join(lib, n, 'site-packages'), path.join(lib, n, 'dist-packages')]);
}

/**
 * Directories where pip's NCCL wheel (nvidia-nccl-cu12 / -cu13) puts libnccl.so.2:
 * `<site-packages>/nvidia/nccl/lib` for PYTHONPATH entries, the active virtualenv or conda
 * environment, the user's ~/.local, and the system Pythons. Only existing directories.
 */
export function ncclCandidateDirs(env: NodeJS.ProcessEnv = process.env): string[] {
  const sites: string[] = [];
  for (const p of (env.PYTHONPATH ?? '').split(path.delimiter)) if (p) sites.push(p);
  for (const prefix of [env.VIRTUAL_ENV, env.CONDA_PREFIX]) if (prefix) sites.push(...pythonLibDirs(prefix));
  const home = env.HOME || os.homedir();
  if (home) sites.push(...pythonLibDirs(path.join(home, '.local')));
  for (const prefix of ['/usr/local', '/usr', '/opt/conda']) sites.push(...pythonLibDirs(prefix));
  sites.push('/usr/lib/python3/dist-packages');
  const out: string[] = [];
  for (const s of sites) {
    const d = path.resolve(s, 'nvidia', 'nccl', 'lib');
    if (!out.includes(d) && existsSync(d)) out.push(d);
  }
  return out;
}

function hasNccl(addon: NativeAddon): addon is NativeAddon & NativeNccl {
  return typeof addon.ncclLoad === 'function';
}

function statusOf(addon: NativeAddon, dirs: readonly string[] | undefined): NcclStatus {
  if (!hasNccl(addon)) return { available: false, reason: NO_NCCL_BUILD };
  try {
    const r = addon.ncclLoad([...(dirs ?? ncclCandidateDirs())]);
    if (!r.ok) return { available: false, reason: r.error ?? 'libnccl.so.2 not loadable' };
    return { available: true, version: r.versionString, versionCode: r.version, path: r.path, initAll: r.initAll === true };
  } catch (e) {
    return { available: false, reason: `ncclLoad failed: ${(e as Error).message}` };
  }
}

/** The addon's NCCL functions with the library loaded, or NcclUnavailableError. */
function requireNccl(addon: NativeAddon, dirs: readonly string[] | undefined): { nccl: NativeNccl; status: NcclStatus } {
  const status = statusOf(addon, dirs);
  if (!status.available) throw new NcclUnavailableError(status.reason ?? 'unknown');
  return { nccl: addon as NativeAddon & NativeNccl, status };
}

/**
 * Loads NCCL (once per process; later calls report the loaded library). Never throws: a missing
 * addon, an addon without NCCL support, or no libnccl.so.2 is `available: false` with a reason.
 */
export function loadNccl(opts: LoadNcclOptions = {}): NcclStatus {
  let addon: NativeAddon;
  try {
    addon = loadAddon(opts.addonPath);
  } catch (e) {
    return { available: false, reason: (e as Error).message };
  }
  return statusOf(addon, opts.candidateDirs);
}

/**
 * A new ncclUniqueId (128 bytes): made by one process, handed to every process that holds a rank
 * (NcclCommunicator.init's uniqueId). Throws NcclUnavailableError without NCCL.
 */
export function createNcclUniqueId(opts: LoadNcclOptions = {}): Uint8Array {
  let addon: NativeAddon;
  try {
    addon = loadAddon(opts.addonPath);
  } catch (e) {
    throw new NcclUnavailableError((e as Error).message);
  }
  const { nccl } = requireNccl(addon, opts.candidateDirs);
  try {
    return nccl.ncclUniqueId();
  } catch (e) {
    throw fromNativeNccl(e, 'createNcclUniqueId');
  }
}

export interface NcclInitOptions {
  /** Ranks in the communicator (default: backends.length, every rank in this process). */
  nranks?: number;
  /** The rank held by each backend (default 0, 1, ...). */
  ranks?: readonly number[];
  /**
   * From createNcclUniqueId() in one process, the same bytes in every process. Required when
   * other processes hold ranks; a new one by default when every rank is here.
   */
  uniqueId?: Uint8Array;
  /** Where to look for libnccl.so.2 (see LoadNcclOptions). */
  candidateDirs?: readonly string[];
}

export interface NcclTransferOptions {
  /** First element of the buffer (default 0). */
  offset?: number;
  /** Elements (default: the rest of the buffer after offset). */
  length?: number;
  /** A stream of the buffer's backend (default: its default stream). */
  stream?: StreamHandle;
}

interface LocalRank {
  readonly rank: number;
  readonly backend: CudaBackend;
  readonly be: CudaBackendInternals;
  readonly comm: number;
}

/** Open ncclGroupStart calls on this thread (NCCL groups are per thread, not per communicator). */
let groupDepth = 0;

function checkBackends(backends: readonly CudaBackend[], what: string): CudaBackendInternals[] {
  if (!Array.isArray(backends) || backends.length === 0) throw new CudaArgumentError(what, 'needs at least one CudaBackend');
  const out: CudaBackendInternals[] = [];
  const devices = new Set<number>();
  backends.forEach((b, i) => {
    if (!(b instanceof CudaBackend)) throw new CudaArgumentError(what, `backends[${i}] is not a CudaBackend`);
    const be = cudaBackendInternals(b);
    be.live();
    if (!be.addon) throw new CudaArgumentError(what, `backends[${i}] was not made by createCudaBackend`);
    if (devices.has(be.device)) throw new CudaArgumentError(what, `two backends on device ${be.device}: NCCL takes one rank per GPU`);
    devices.add(be.device);
    if (i > 0 && be.addon !== out[0].addon) throw new CudaArgumentError(what, `backends[${i}] was made by another copy of the addon`);
    out.push(be);
  });
  return out;
}

/**
 * An NCCL communicator with one or more of its ranks in this process, each on its own
 * CudaBackend (GPU). Transfers move a range of a 'vram' buffer; the element type follows the
 * buffer's dtype and the rank is that of the backend owning the buffer. With several ranks in
 * this process, every send and recv must sit inside group() (one thread drives all of them;
 * ungrouped, the first transfer would wait for a peer that this thread has not reached yet).
 */
export class NcclCommunicator {
  private destroyed = false;
  /** Communicator ids already destroyed or aborted. */
  private readonly released = new Set<number>();

  private constructor(
    private readonly nccl: NativeNccl,
    /** The library in use. */
    readonly library: NcclStatus,
    /** Ranks in the communicator (all processes). */
    readonly nranks: number,
    private readonly locals: readonly LocalRank[],
  ) {}

  /**
   * Every rank in this process, rank i on backends[i], made by ncclCommInitAll (or, where the
   * library lacks it, per-rank init in one group).
   */
  static initAll(backends: readonly CudaBackend[], opts: { candidateDirs?: readonly string[] } = {}): NcclCommunicator {
    const what = 'NcclCommunicator.initAll';
    const bes = checkBackends(backends, what);
    const { nccl, status } = requireNccl(bes[0].addon!, opts.candidateDirs);
    if (!status.initAll) return NcclCommunicator.initRanks(nccl, status, backends, bes, backends.length, [...backends.keys()], undefined, what);
    let ids: number[];
    try {
      ids = nccl.ncclCommInitAll(bes.map((b) => b.device));
    } catch (e) {
      throw fromNativeNccl(e, what);
    }
    return new NcclCommunicator(
      nccl,
      status,
      backends.length,
      bes.map((be, i) => ({ rank: i, backend: backends[i], be, comm: ids[i] })),
    );
  }

  /**
   * Ranks `ranks[i]` of an `nranks`-rank communicator on backends[i], joined through
   * `uniqueId` (ncclCommInitRank; several ranks here are initialized in one group). Blocks until
   * every rank of every process has joined.
   */
  static init(backends: readonly CudaBackend[], opts: NcclInitOptions = {}): NcclCommunicator {
    const what = 'NcclCommunicator.init';
    if (!Array.isArray(backends) || backends.length === 0) throw new CudaArgumentError(what, 'needs at least one CudaBackend');
    const n = backends.length;
    const nranks = opts.nranks ?? n;
    if (!Number.isInteger(nranks) || nranks < n)
      throw new CudaArgumentError(what, `nranks must be an integer >= the number of backends (${n}), got ${nranks}`);
    const ranks = opts.ranks ?? Array.from({ length: n }, (_, i) => i);
    if (!Array.isArray(ranks) || ranks.length !== n) throw new CudaArgumentError(what, `ranks must list one rank per backend (${n}), got ${String(ranks)}`);
    for (const r of ranks)
      if (!Number.isInteger(r) || r < 0 || r >= nranks) throw new CudaArgumentError(what, `rank ${r} is not an integer in [0, ${nranks})`);
    if (new Set(ranks).size !== ranks.length) throw new CudaArgumentError(what, `ranks repeat: ${ranks.join(', ')}`);
    if (opts.uniqueId !== undefined && (!(opts.uniqueId instanceof Uint8Array) || opts.uniqueId.length !== NCCL_UNIQUE_ID_BYTES))
      throw new CudaArgumentError(what, `uniqueId must be a Uint8Array of ${NCCL_UNIQUE_ID_BYTES} bytes (from createNcclUniqueId)`);
    if (opts.uniqueId === undefined && nranks > n)
      throw new CudaArgumentError(what, `uniqueId is required when other processes hold ranks (${n} of ${nranks} here)`);
    const bes = checkBackends(backends, what);
    const { nccl, status } = requireNccl(bes[0].addon!, opts.candidateDirs);
    return NcclCommunicator.initRanks(nccl, status, backends, bes, nranks, ranks, opts.uniqueId, what);
  }

  /** ncclCommInitRank for each local rank (in one group when there are several). */
  private static initRanks(
    nccl: NativeNccl,
    status: NcclStatus,
    backends: readonly CudaBackend[],
    bes: readonly CudaBackendInternals[],
    nranks: number,
    ranks: readonly number[],
    uniqueId: Uint8Array | undefined,
    what: string,
  ): NcclCommunicator {
    if (typeof bes[0].ctx.ncclCommInit !== 'function') throw new NcclUnavailableError(NO_NCCL_BUILD);
    const n = bes.length;
    let id: Uint8Array;
    try {
      id = uniqueId ?? nccl.ncclUniqueId();
    } catch (e) {
      throw fromNativeNccl(e, what);
    }
    const ids: number[] = [];
    const initOne = (i: number) => ids.push(bes[i].ctx.ncclCommInit!(nranks, ranks[i], id));
    try {
      if (n === 1) initOne(0);
      else {
        // One thread, several ranks: each init would wait for the others, so they go in one group.
        nccl.ncclGroupStart();
        let err: unknown;
        try {
          for (let i = 0; i < n; i++) initOne(i);
        } catch (e) {
          err = e;
        }
        try {
          nccl.ncclGroupEnd();
        } catch (e) {
          err ??= e;
        }
        if (err !== undefined) throw err;
      }
    } catch (e) {
      for (const c of ids) {
        try {
          nccl.ncclCommAbort(c);
        } catch {
          // already failed; the first error is the one to report
        }
      }
      throw fromNativeNccl(e, what);
    }
    return new NcclCommunicator(
      nccl,
      status,
      nranks,
      bes.map((be, i) => ({ rank: ranks[i], backend: backends[i], be, comm: ids[i] })),
    );
  }

  /** The ranks held in this process, in the order of the backends given. */
  get ranks(): readonly number[] {
    return this.locals.map((l) => l.rank);
  }

  get isDestroyed(): boolean {
    return this.destroyed;
  }

  /** The rank `backend` holds. */
  rankOf(backend: CudaBackend): number {
    const l = this.locals.find((x) => x.backend === backend);
    if (!l) throw new CudaArgumentError('NcclCommunicator.rankOf', 'the backend holds no rank of this communicator');
    return l.rank;
  }

  /** What NCCL reports for a local rank (default: the first): nranks, rank, device, a pending async error. */
  info(rank = this.locals[0].rank): NativeNcclCommInfo {
    this.alive('NcclCommunicator.info');
    const l = this.locals.find((x) => x.rank === rank);
    if (!l) throw new CudaArgumentError('NcclCommunicator.info', `rank ${rank} is not held in this process (local ranks: ${this.ranks.join(', ')})`);
    try {
      return this.nccl.ncclCommInfo(l.comm);
    } catch (e) {
      throw fromNativeNccl(e, 'NcclCommunicator.info');
    }
  }

  /** Sends elements [offset, offset + length) of `buf` to rank `peer`, enqueued on `stream`. */
  send(buf: DeviceBuffer, peer: number, opts: NcclTransferOptions = {}): void {
    this.transfer(true, buf, peer, opts);
  }

  /** Receives into elements [offset, offset + length) of `buf` from rank `peer`, enqueued on `stream`. */
  recv(buf: DeviceBuffer, peer: number, opts: NcclTransferOptions = {}): void {
    this.transfer(false, buf, peer, opts);
  }

  private transfer(send: boolean, buf: DeviceBuffer, peer: number, opts: NcclTransferOptions): void {
    const what = send ? 'nccl send' : 'nccl recv';
    this.alive(what);
    if (!buf || typeof buf !== 'object') throw new CudaArgumentError(what, 'expected a DeviceBuffer');
    const l = this.locals.find((x) => x.be.owns(buf));
    if (!l) throw new CudaArgumentError(what, `buffer #${buf.id} is not a live buffer of a backend holding a rank of this communicator`);
    l.be.live();
    if (!Number.isInteger(peer) || peer < 0 || peer >= this.nranks) throw new CudaArgumentError(what, `peer must be an integer in [0, ${this.nranks}), got ${peer}`);
    if (this.locals.length > 1 && groupDepth === 0)
      throw new CudaArgumentError(what, `${this.locals.length} ranks live in this process: put sends and receives inside group()`);
    const offset = opts.offset ?? 0;
    const length = opts.length ?? buf.length - offset;
    const { addr, dtype } = l.be.vramRange(buf, offset, length, what);
    const stream = l.be.streamId(opts.stream);
    const nccl = NCCL_DTYPE_OF[dtype];
    if (!nccl) throw new CudaArgumentError(what, `a ${dtype} buffer does not travel over NCCL (activations and KV only)`);
    const code = this.nccl.ncclDataTypes[nccl];
    try {
      if (send) l.be.ctx.ncclSend!(l.comm, addr, length, code, peer, stream);
      else l.be.ctx.ncclRecv!(l.comm, addr, length, code, peer, stream);
    } catch (e) {
      throw fromNativeNccl(e, what);
    }
  }

  /** ncclGroupStart: calls until the matching groupEnd are issued together. */
  groupStart(): void {
    this.alive('nccl groupStart');
    try {
      this.nccl.ncclGroupStart();
    } catch (e) {
      throw fromNativeNccl(e, 'nccl groupStart');
    }
    groupDepth++;
  }

  /** ncclGroupEnd: issues the calls made since the matching groupStart. */
  groupEnd(): void {
    if (groupDepth === 0) throw new CudaArgumentError('nccl groupEnd', 'no group is open (groupStart first)');
    groupDepth--;
    try {
      this.nccl.ncclGroupEnd();
    } catch (e) {
      throw fromNativeNccl(e, 'nccl groupEnd');
    }
  }

  /** Runs `fn` between groupStart and groupEnd (the group is closed when `fn` throws too). */
  group<T>(fn: () => T): T {
    this.groupStart();
    let result: T;
    try {
      result = fn();
    } catch (e) {
      try {
        this.groupEnd();
      } catch {
        // fn's error is the one to report
      }
      throw e;
    }
    this.groupEnd();
    return result;
  }

  /**
   * ncclCommDestroy on every local rank (waits for their pending work). Idempotent; after a
   * failure the communicator stays usable for abort(), which frees the ranks not yet released.
   */
  destroy(): void {
    this.release(false);
  }

  /** ncclCommAbort on every local rank: frees them without waiting (after an error). Idempotent. */
  abort(): void {
    this.release(true);
  }

  private release(abort: boolean): void {
    if (this.destroyed) return;
    let first: Error | undefined;
    for (const l of this.locals) {
      if (this.released.has(l.comm)) continue;
      try {
        if (abort) this.nccl.ncclCommAbort(l.comm);
        else this.nccl.ncclCommDestroy(l.comm);
        this.released.add(l.comm);
      } catch (e) {
        first ??= fromNativeNccl(e, abort ? 'NcclCommunicator.abort' : 'NcclCommunicator.destroy');
      }
    }
    if (first) throw first;
    this.destroyed = true;
  }

  private alive(what: string): void {
    if (this.destroyed) throw new CudaArgumentError(what, 'the NCCL communicator was destroyed');
  }
}
