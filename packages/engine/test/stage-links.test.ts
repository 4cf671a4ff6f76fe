import { createCpuBackend } from '@nerva/cpu-backend';
import type { DeviceBackend, DeviceBuffer, StreamHandle } from '@nerva/core';
import { HotPathAllocationError } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { HostStageLink, makeStageLink, NcclStageLink, type NcclPointToPoint, SameBackendStageLink, type StageLink, StageLinkUsageError } from '../src/index.js';

const shape = { fromStage: 0, toStage: 1, rowWidth: 2, maxRows: 3, dtype: 'f32' as const };

function buf(be: DeviceBackend, values: number[]): DeviceBuffer {
  const b = be.alloc({ dtype: 'f32', length: values.length });
  be.write(b, Float32Array.from(values));
  return b;
}

/** A CPU backend whose stream, event and copy calls are logged under a name. */
function logged(name: string, log: string[]): DeviceBackend {
  const inner = createCpuBackend();
  const s = (x?: StreamHandle) => `s${x?.id ?? 0}`;
  const wrap: Partial<Record<keyof DeviceBackend, (...a: never[]) => unknown>> = {
    copy: (dst: DeviceBuffer, src: DeviceBuffer, n: number, d = 0, o = 0, st?: StreamHandle) => {
      log.push(`${name} copy ${n} ${s(st)}`);
      return inner.copy(dst, src, n, d, o, st);
    },
    record: (e: { id: number }, st?: StreamHandle) => {
      log.push(`${name} record e${e.id} ${s(st)}`);
      return inner.record(e, st);
    },
    waitEvent: (st: StreamHandle, e: { id: number }) => {
      log.push(`${name} wait ${s(st)} e${e.id}`);
      return inner.waitEvent(st, e);
    },
  };
  return new Proxy(inner, {
    get(target, prop, receiver) {
      if (prop in wrap) return wrap[prop as keyof DeviceBackend];
      const v = Reflect.get(target, prop, receiver) as unknown;
      return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(target) : v;
    },
  }) as DeviceBackend;
}

/**
 * Point-to-point between backends of this process: a send and a recv in one group are matched by
 * peer and length, and the rows move (read off one backend, written into the other) at the group's end.
 */
class FakeNccl implements NcclPointToPoint {
  private open: { send: boolean; buf: DeviceBuffer; peer: number; length: number; stream?: StreamHandle }[] | null = null;
  constructor(
    private readonly backends: DeviceBackend[],
    private readonly log: string[],
  ) {}
  private owner(b: DeviceBuffer): number {
    const r = this.backends.findIndex((be) => {
      try {
        be.peek(b, 0, 0);
        return true;
      } catch {
        return false;
      }
    });
    if (r < 0) throw new Error('buffer of no rank');
    return r;
  }
  send(buf: DeviceBuffer, peer: number, o: { length?: number; stream?: StreamHandle }) {
    if (!this.open) throw new Error('ungrouped send');
    this.open.push({ send: true, buf, peer, length: o.length!, stream: o.stream });
    this.log.push(`nccl send ${o.length} to ${peer} s${o.stream?.id ?? 0}`);
  }
  recv(buf: DeviceBuffer, peer: number, o: { length?: number; stream?: StreamHandle }) {
    if (!this.open) throw new Error('ungrouped recv');
    this.open.push({ send: false, buf, peer, length: o.length!, stream: o.stream });
    this.log.push(`nccl recv ${o.length} from ${peer} s${o.stream?.id ?? 0}`);
  }
  group<T>(fn: () => T): T {
    this.open = [];
    const r = fn();
    const ops = this.open;
    this.open = null;
    for (const s of ops.filter((x) => x.send)) {
      const from = this.owner(s.buf);
      const r2 = ops.find((x) => !x.send && x.peer === from && this.owner(x.buf) === s.peer && x.length === s.length);
      if (!r2) throw new Error('unmatched send');
      this.backends[s.peer].write(r2.buf, this.backends[from].peek(s.buf, 0, s.length) as Float32Array);
    }
    return r;
  }
}

describe('SameBackendStageLink', () => {
  it('copies the sent rows at recv, a device-copy on a GPU and in-process on the CPU', () => {
    const be = createCpuBackend();
    const link = new SameBackendStageLink(be, shape);
    expect(link.kind).toBe('in-process');
    const src = buf(be, [1, 2, 3, 4, 5, 6]);
    const dst = buf(be, [0, 0, 0, 0, 0, 0]);
    be.setHotPath(true);
    link.send(src, 2);
    link.recv(dst, 2);
    be.setHotPath(false);
    expect([...be.read(dst)]).toEqual([1, 2, 3, 4, 0, 0]);
    const gpu = new Proxy(be, { get: (t, p, r) => (p === 'capabilities' ? { ...t.capabilities, deviceKind: 'cuda' } : Reflect.get(t, p, r)) }) as DeviceBackend;
    expect(new SameBackendStageLink(gpu, shape).kind).toBe('device-copy');
  });

  it('rejects out-of-order use, wrong buffers and a recv on another stream', () => {
    const be = createCpuBackend();
    const link = new SameBackendStageLink(be, shape);
    const src = buf(be, [1, 2, 3, 4, 5, 6]);
    const small = buf(be, [0, 0]);
    expect(() => link.recv(small, 1)).toThrow(StageLinkUsageError);
    expect(() => link.recv(small, 1)).toThrow('stage link 0->1: recv with nothing sent');
    link.send(src, 1);
    expect(() => link.send(src, 1)).toThrow(/send before the previous 1 rows were received/);
    expect(() => link.recv(small, 2)).toThrow(/recv of 2 rows, 1 were sent|holds 2 elements, 2 rows need 4/);
    expect(() => link.recv(small, 1, be.createStream())).toThrow(/this link orders both on one stream/);
    link.send(src, 1);
    expect(() => link.send(src, 4)).toThrow(/0..3 allowed/);
    const ids = be.alloc({ dtype: 'i32', length: 8 });
    expect(() => link.recv(ids, 1)).toThrow(/recv buffer is i32, the link carries f32/);
    link.close();
    expect(() => link.send(src, 1)).toThrow(/after close/);
  });
});

describe('HostStageLink', () => {
  it('moves rows between two CPU backends through a host buffer made up front', () => {
    const a = createCpuBackend();
    const b = createCpuBackend();
    const link = makeStageLink({ backend: a }, { backend: b }, shape);
    expect(link).toBeInstanceOf(HostStageLink);
    expect(link.kind).toBe('in-process');
    const src = buf(a, [1, 2, 3, 4, 5, 6]);
    const dst = buf(b, [9, 9, 9, 9, 9, 9]);
    a.setHotPath(true);
    b.setHotPath(true);
    link.send(src, 3);
    link.recv(dst, 3);
    a.setHotPath(false);
    b.setHotPath(false);
    expect([...b.read(dst)]).toEqual([1, 2, 3, 4, 5, 6]);
    const ids = makeStageLink({ backend: a }, { backend: b }, { ...shape, rowWidth: 1, dtype: 'i32' });
    const t = a.alloc({ dtype: 'i32', length: 3 });
    a.write(t, Int32Array.from([7, 8, 9]));
    const u = b.alloc({ dtype: 'i32', length: 3 });
    ids.send(t, 2);
    ids.recv(u, 2);
    expect([...b.read(u)]).toEqual([7, 8, 0]);
  });
});

describe('NcclStageLink', () => {
  const pair = () => {
    const log: string[] = [];
    const a = logged('A', log);
    const b = logged('B', log);
    const nccl = new FakeNccl([a, b], log);
    return { log, a, b, nccl };
  };

  it('staged: a copy into the send buffer, NCCL on dedicated streams, the receiver waits for the arrival', () => {
    const { log, a, b, nccl } = pair();
    const link = new NcclStageLink(nccl, { backend: a, rank: 0 }, { backend: b, rank: 1 }, shape, true);
    expect(link.kind).toBe('nccl');
    const src = buf(a, [1, 2, 3, 4, 5, 6]);
    const dst = buf(b, [0, 0, 0, 0, 0, 0]);
    const round = (rows: number) => {
      log.length = 0;
      link.send(src, rows);
      link.recv(dst, rows);
      return [...log];
    };
    const first = round(2);
    expect([...b.read(dst)]).toEqual([1, 2, 3, 4, 0, 0]);
    // Events and streams by role: e(ready) on A's compute stream, NCCL on A's and B's own streams.
    expect(first.map((l) => l.replace(/e\d+/g, 'e').replace(/s[1-9]\d*/g, 'sX'))).toEqual([
      'A copy 4 s0',
      'A record e s0',
      'A wait sX e',
      'nccl send 4 to 1 sX',
      'nccl recv 4 from 0 sX',
      'A record e sX',
      'B record e sX',
      'B wait s0 e',
      'B copy 4 s0',
      'B record e s0',
    ]);
    // Later rounds wait for the previous transfer (before refilling) and copy-out (before receiving).
    a.write(src, Float32Array.from([6, 5, 4, 3, 2, 1]));
    a.setHotPath(true);
    b.setHotPath(true);
    const second = round(3);
    expect(second.filter((l) => l.includes('wait'))).toHaveLength(4);
    expect(second[0]).toMatch(/^A wait s0 e\d+$/);
    expect([...b.read(dst)]).toEqual([6, 5, 4, 3, 2, 1]);
    a.setHotPath(false);
    b.setHotPath(false);
    link.close();
    expect(() => link.send(src, 1)).toThrow(/after close/);
  });

  it('direct: the NCCL pair runs between the two buffers on the callers\' streams', () => {
    const { log, a, b, nccl } = pair();
    void nccl;
    const ranked = new FakeNccl([b, a], log); // ranks: b is 0, a is 1
    const link: StageLink = new NcclStageLink(ranked, { backend: a, rank: 1 }, { backend: b, rank: 0 }, { ...shape, fromStage: 1, toStage: 0 }, false);
    const src = buf(a, [1, 2, 3, 4, 5, 6]);
    const dst = buf(b, [0, 0, 0, 0, 0, 0]);
    log.length = 0;
    link.send(src, 1);
    link.recv(dst, 1);
    expect(log).toEqual(['nccl send 2 to 0 s0', 'nccl recv 2 from 1 s0']);
    expect([...b.read(dst)]).toEqual([1, 2, 0, 0, 0, 0]);
    link.close();
    // Nothing was allocated for a direct link.
    expect(a.stats().liveBuffers).toBe(1);
  });

  it('is made for two CUDA backends only with a communicator; staging is allocated up front', () => {
    const { a, b, nccl } = pair();
    const gpu = (x: DeviceBackend) => new Proxy(x, { get: (t, p, r) => (p === 'capabilities' ? { ...t.capabilities, deviceKind: 'cuda' } : Reflect.get(t, p, r)) }) as DeviceBackend;
    const [ga, gb] = [gpu(a), gpu(b)];
    expect(() => makeStageLink({ backend: ga, rank: 0 }, { backend: gb, rank: 1 }, shape)).toThrow(/needs an NCCL communicator/);
    const made = makeStageLink({ backend: ga, rank: 0 }, { backend: gb, rank: 1 }, shape, { nccl, staged: true });
    expect(made).toBeInstanceOf(NcclStageLink);
    expect(a.stats().liveBuffers).toBe(1);
    made.close();
    expect(() => makeStageLink({ backend: ga }, { backend: b }, shape)).toThrow(/no stage link joins a cuda backend \(stage 0\) and a cpu backend \(stage 1\)/);
    a.setHotPath(true);
    expect(() => new NcclStageLink(nccl, { backend: a, rank: 0 }, { backend: b, rank: 1 }, shape, true)).toThrow(HotPathAllocationError);
    a.setHotPath(false);
    // A failed construction leaves nothing behind.
    expect(a.stats().liveBuffers).toBe(0);
  });
});
