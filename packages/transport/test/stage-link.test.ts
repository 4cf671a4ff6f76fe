import { HotPathAllocationError, type BufferSpec, type DeviceBackend, type DeviceBuffer, type EventHandle, type StreamHandle } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { InProcessStageLink, pipelineDeviceOrder, planStages, stageOfLayer, StageLinkError, TransportArgumentError } from '../src/index.js';
import { loadFixture, matrix } from './helpers.js';

describe('planStages', () => {
  it('splits equal layers evenly, earlier stages taking the remainder', () => {
    const p = planStages(10, 3);
    expect(p.stages.map((s) => [s.firstLayer, s.endLayer])).toEqual([
      [0, 4],
      [4, 7],
      [7, 10],
    ]);
    expect(p).toMatchObject({ totalBytes: 10, maxStageBytes: 4 });
    expect(p.imbalance).toBeCloseTo(1.2, 10);
    expect(planStages(36, 4).stages.map((s) => s.layers)).toEqual([9, 9, 9, 9]);
    expect(planStages(5, 5).stages.map((s) => s.layers)).toEqual([1, 1, 1, 1, 1]);
    expect(planStages(7, 1).stages).toEqual([{ stage: 0, firstLayer: 0, endLayer: 7, layers: 7, bytes: 7 }]);
  });

  it('balances by bytes: a heavy embedding stage gets fewer layers', () => {
    const bytes = [400, 100, 100, 100, 100, 100, 100, 300];
    const p = planStages(8, 3, bytes);
    expect(p.stages.map((s) => [s.firstLayer, s.endLayer, s.bytes])).toEqual([
      [0, 2, 500],
      [2, 6, 400],
      [6, 8, 400],
    ]);
    expect(p.maxStageBytes).toBe(500);
    // Optimal: no contiguous split has a smaller largest stage.
    let best = Infinity;
    for (let i = 1; i < 7; i++)
      for (let j = i + 1; j < 8; j++) {
        const sum = (a: number, b: number) => bytes.slice(a, b).reduce((x, y) => x + y, 0);
        best = Math.min(best, Math.max(sum(0, i), sum(i, j), sum(j, 8)));
      }
    expect(p.maxStageBytes).toBe(best);
  });

  it('is optimal on random weights (checked by brute force) and covers every layer once', () => {
    let seed = 7;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    for (let round = 0; round < 40; round++) {
      const n = 2 + Math.floor(rnd() * 9);
      const s = 1 + Math.floor(rnd() * Math.min(n, 4));
      const w = Array.from({ length: n }, () => Math.floor(rnd() * 1000));
      const p = planStages(n, s, w);
      expect(p.stages).toHaveLength(s);
      expect(p.stages[0].firstLayer).toBe(0);
      expect(p.stages.at(-1)?.endLayer).toBe(n);
      for (let i = 1; i < s; i++) expect(p.stages[i].firstLayer).toBe(p.stages[i - 1].endLayer);
      expect(p.stages.every((st) => st.layers >= 1)).toBe(true);
      const brute = (from: number, k: number): number => {
        if (k === 1) return w.slice(from).reduce((a, b) => a + b, 0);
        let m = Infinity;
        for (let e = from + 1; e <= n - (k - 1); e++) m = Math.min(m, Math.max(w.slice(from, e).reduce((a, b) => a + b, 0), brute(e, k - 1)));
        return m;
      };
      expect(p.maxStageBytes).toBe(brute(0, s));
    }
  });

  it('balances zero weights by layer count', () => {
    expect(planStages(4, 2, [0, 0, 0, 0]).stages.map((s) => [s.layers, s.bytes])).toEqual([
      [2, 0],
      [2, 0],
    ]);
  });

  it('validates its arguments', () => {
    expect(() => planStages(4, 0)).toThrow(TransportArgumentError);
    expect(() => planStages(4, 5)).toThrow(/exceeds numLayers/);
    expect(() => planStages(0, 1)).toThrow(/numLayers/);
    expect(() => planStages(4, 1.5)).toThrow(/numStages/);
    expect(() => planStages(3, 2, [1, 2])).toThrow(/2 entries for 3 layers/);
    expect(() => planStages(2, 2, [1, NaN])).toThrow(/layerBytes\[1\]/);
    expect(() => planStages(2, 2, [1, -1])).toThrow(/layerBytes\[1\]/);
  });

  it('maps layers to stages', () => {
    const p = planStages(10, 3);
    expect([0, 3, 4, 6, 7, 9].map((l) => stageOfLayer(p, l))).toEqual([0, 0, 1, 1, 2, 2]);
    expect(() => stageOfLayer(p, 10)).toThrow(/outside 0..9/);
  });
});

describe('pipelineDeviceOrder', () => {
  it('follows the best links', () => {
    expect(pipelineDeviceOrder(loadFixture('h200-nvlink-2gpu'))).toEqual([0, 1]);
    expect(pipelineDeviceOrder(loadFixture('h100-sxm-vm'))).toEqual([0]);
    // Four devices on the PCIe fixture's two GPUs is impossible; use a runtime with NVLink between 0-2 and 1-3.
    const t = loadFixture('pcie-2gpu-iommu', {
      deviceCount: 4,
      peerAccess: matrix(4, true, false),
      nvlinkLinks: [
        [0, 0, 4, 0],
        [0, 0, 0, 4],
        [4, 0, 0, 2],
        [0, 4, 2, 0],
      ],
    });
    expect(pipelineDeviceOrder(t)).toEqual([0, 2, 3, 1]);
  });
});

/** A backend that implements only what a stage link uses, over Float32Arrays. */
class FakeBackend {
  readonly log: string[] = [];
  private next = 1;
  private armed = false;
  readonly data = new Map<number, Float32Array>();
  alloc(spec: BufferSpec): DeviceBuffer {
    if (this.armed) throw new HotPathAllocationError(spec.label ?? 'buffer');
    const id = this.next++;
    this.data.set(id, new Float32Array(spec.length));
    this.log.push(`alloc ${spec.length}`);
    return { id, dtype: spec.dtype, length: spec.length, byteLength: spec.length * 4, tier: 'vram', usage: spec.usage ?? 'activations', label: spec.label };
  }
  free(buf: DeviceBuffer) {
    this.data.delete(buf.id);
    this.log.push(`free ${buf.id}`);
  }
  copy(dst: DeviceBuffer, src: DeviceBuffer, length: number, dstOffset = 0, srcOffset = 0, stream?: StreamHandle) {
    (this.data.get(dst.id) as Float32Array).set((this.data.get(src.id) as Float32Array).subarray(srcOffset, srcOffset + length), dstOffset);
    this.log.push(`copy ${length} s${stream?.id ?? 0}`);
  }
  createEvent(): EventHandle {
    return { id: this.next++ };
  }
  destroyEvent() {
    this.log.push('destroyEvent');
  }
  record(_e: EventHandle, stream?: StreamHandle) {
    this.log.push(`record s${stream?.id ?? 0}`);
  }
  waitEvent(stream: StreamHandle) {
    this.log.push(`wait s${stream.id}`);
  }
  synchronize(kind: string, stream?: StreamHandle) {
    this.log.push(`sync ${kind} s${stream?.id ?? 0}`);
  }
  setHotPath(a: boolean) {
    this.armed = a;
  }
  buffer(values: number[]): DeviceBuffer {
    const b = this.alloc({ dtype: 'f32', length: values.length });
    (this.data.get(b.id) as Float32Array).set(values);
    return b;
  }
}

describe('InProcessStageLink', () => {
  const make = () => {
    const be = new FakeBackend();
    const link = new InProcessStageLink(be as unknown as DeviceBackend, { fromStage: 0, toStage: 1, rowWidth: 2, maxRows: 3, dtype: 'f32' });
    return { be, link };
  };

  it('hands rows from one stage to the next, ordered by an event between streams', () => {
    const { be, link } = make();
    const src = be.buffer([1, 2, 3, 4, 5, 6]);
    const dst = be.buffer([0, 0, 0, 0, 0, 0]);
    be.log.length = 0;
    link.send(src, 2, { id: 10 });
    link.recv(dst, 2, { id: 11 });
    expect([...(be.data.get(dst.id) as Float32Array)]).toEqual([1, 2, 3, 4, 0, 0]);
    expect(be.log).toEqual(['copy 4 s10', 'record s10', 'wait s11', 'copy 4 s11']);
    expect(link).toMatchObject({ kind: 'in-process', fromStage: 0, toStage: 1, rowWidth: 2, maxRows: 3, dtype: 'f32' });
  });

  it('does not allocate per handoff, so it runs under the hot-path guard', () => {
    const { be, link } = make();
    const src = be.buffer([1, 2, 3, 4, 5, 6]);
    const dst = be.buffer([0, 0, 0, 0, 0, 0]);
    be.setHotPath(true);
    for (let i = 0; i < 3; i++) {
      link.send(src, 3);
      link.recv(dst, 3);
    }
    expect([...(be.data.get(dst.id) as Float32Array)]).toEqual([1, 2, 3, 4, 5, 6]);
    expect(() => new InProcessStageLink(be as unknown as DeviceBackend, { fromStage: 1, toStage: 2, rowWidth: 2, maxRows: 1, dtype: 'f32' })).toThrow(HotPathAllocationError);
  });

  it('synchronizes the send stream (phase_handoff) when the receiver has no stream to wait on', () => {
    const { be, link } = make();
    const src = be.buffer([1, 2]);
    const dst = be.buffer([0, 0]);
    be.log.length = 0;
    link.send(src, 1, { id: 4 });
    link.recv(dst, 1);
    expect(be.log).toEqual(['copy 2 s4', 'record s4', 'sync phase_handoff s4', 'copy 2 s0']);
  });

  it('rejects out-of-order use and wrong buffers', () => {
    const { be, link } = make();
    const src = be.buffer([1, 2, 3, 4, 5, 6]);
    const small = be.buffer([0, 0]);
    expect(() => link.recv(small, 1)).toThrow(/recv with nothing sent/);
    link.send(src, 1);
    expect(() => link.send(src, 1)).toThrow(/send before the previous 1 rows were received/);
    expect(() => link.recv(small, 2)).toThrow(StageLinkError);
    expect(() => link.recv(small, 2)).toThrow(/holds 2 elements, 2 rows need 4/);
    link.recv(small, 1);
    expect(() => link.send(src, 4)).toThrow(/0..3 allowed/);
    expect(() => link.send({ ...src, dtype: 'bf16' }, 1)).toThrow(/buffer is bf16, link carries f32/);
    link.close();
    expect(be.log.slice(-2)).toEqual(['free 1', 'destroyEvent']);
    expect(() => link.send(src, 1)).toThrow(/after close/);
    expect(() => new InProcessStageLink(be as unknown as DeviceBackend, { fromStage: 0, toStage: 1, rowWidth: 0, maxRows: 1, dtype: 'f32' })).toThrow(TransportArgumentError);
  });
});
