import { createCpuBackend } from '@nerva/cpu-backend';
import type { DeviceBackend, DeviceBuffer, OpArgs, OpName } from '@nerva/core';

export interface Recorded {
  op: OpName;
  rows: number | undefined;
  normed: boolean;
  /** The op's arguments as given (buffers by reference). */
  args: Readonly<Record<string, unknown>>;
}

/** A recorded backend.copy (lengths and offsets in elements). */
export interface RecordedCopy {
  dst: DeviceBuffer;
  src: DeviceBuffer;
  length: number;
  dstOffset: number;
  srcOffset: number;
}

/**
 * The CPU backend with every op call (and every copy) recorded (name, rows, whether a norm weight rode along),
 * and every allocation's label.
 * Ops listed in `without` are left out of its capabilities, as on a backend that lacks them, so
 * the engine takes the path it would take there; `claim` adds capabilities (e.g. batchInvariant,
 * which the CPU backend's rows satisfy: they never depend on each other).
 */
export function recordingBackend(
  without: readonly OpName[] = [],
  claim: Partial<DeviceBackend['capabilities']> = {},
): { backend: DeviceBackend; calls: Recorded[]; copies: RecordedCopy[]; allocs: string[] } {
  const inner = createCpuBackend();
  const calls: Recorded[] = [];
  const copies: RecordedCopy[] = [];
  const allocs: string[] = [];
  const capabilities = Object.freeze({ ...inner.capabilities, ...claim, ops: inner.capabilities.ops.filter((op) => !without.includes(op)) });
  const backend = new Proxy(inner, {
    get(target, prop, receiver) {
      if (prop === 'capabilities') return capabilities;
      if (prop === 'run') {
        return <K extends OpName>(op: K, args: OpArgs<K>, stream?: Parameters<DeviceBackend['run']>[2]) => {
          if (without.includes(op)) throw new Error(`op ${op} was left out of this backend's capabilities`);
          const a = args as { rows?: number; normWeight?: unknown };
          calls.push({ op, rows: a.rows, normed: a.normWeight !== undefined, args: args as Record<string, unknown> });
          return target.run(op, args, stream);
        };
      }
      if (prop === 'alloc') {
        return (spec: Parameters<DeviceBackend['alloc']>[0]) => {
          allocs.push(spec.label ?? '');
          return target.alloc(spec);
        };
      }
      if (prop === 'copy') {
        return (dst: DeviceBuffer, src: DeviceBuffer, length: number, dstOffset = 0, srcOffset = 0, stream?: Parameters<DeviceBackend['copy']>[5]) => {
          copies.push({ dst, src, length, dstOffset, srcOffset });
          target.copy(dst, src, length, dstOffset, srcOffset, stream);
        };
      }
      const v = Reflect.get(target, prop, receiver) as unknown;
      return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(target) : v;
    },
  }) as DeviceBackend;
  return { backend, calls, copies, allocs };
}

/**
 * The recorded calls split into forward passes: each starts with an embedding, or with a
 * decoder_layers op that takes the embedding itself (its `embed`, capabilities.opFields).
 */
export function passes(calls: readonly Recorded[]): Recorded[][] {
  const out: Recorded[][] = [];
  for (const c of calls) {
    if (c.op === 'embedding' || (c.op === 'decoder_layers' && c.args.embed !== undefined)) out.push([]);
    out.at(-1)?.push(c);
  }
  return out;
}
