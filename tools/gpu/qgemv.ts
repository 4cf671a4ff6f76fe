// GPU machine: the quantized GEMV against the copy roofline measured in the same process. For each
// block type and each projection of the Qwen3-8B decode step (one row), the weight bytes streamed a
// second over the device copy bandwidth. Random blocks (scales finite): speed does not depend on
// the values. Writes one JSON line per (type, shape) to stdout and $OUT/qgemv.jsonl.
import { appendFileSync } from 'node:fs';
import path from 'node:path';
import { QUANT_BLOCKS, type DeviceBuffer, type QuantDType } from '@nerva/core';
import { ConformanceRng, randomBlocks } from '@nerva/core/conformance';
import { measureCopyBandwidth } from '@nerva/bench';
import { createCudaBackend } from '@nerva/cuda-backend';

const out = process.env.OUT ?? '.';
const be = createCudaBackend({ deviceArenaBytes: 24 * 2 ** 30 });
const copyGBs = measureCopyBandwidth(be, 1024 * 2 ** 20, 20) / 1e9;
const types: QuantDType[] = ['q4_k', 'q6_k', 'q8_0', 'q4_0'];
const H = 4096, I = 14336, V = 151936;
const shapes = [
  { name: 'qkv', inDim: H, outDim: 6144, norm: true, glu: false },
  { name: 'o', inDim: H, outDim: H, norm: false, glu: false },
  { name: 'gate_up', inDim: H, outDim: I, norm: true, glu: true },
  { name: 'down', inDim: I, outDim: H, norm: false, glu: false },
  { name: 'lm_head', inDim: H, outDim: V, norm: true, glu: false },
];
const rng = new ConformanceRng(7);
const f32 = (n: number): DeviceBuffer => be.alloc({ dtype: 'f32', length: n, usage: 'activations' });
for (const q of types) {
  for (const s of shapes) {
    for (const rows of [1, 4]) {
      const n = (s.glu ? 2 : 1) * s.outDim * s.inDim;
      const w = be.alloc({ dtype: q, length: n, usage: 'weights' });
      // Written a slab at a time: one host copy of a 0.6 G-element matrix would not fit a string of blocks.
      const slab = s.inDim * 256;
      for (let off = 0; off < n; off += slab) be.write(w, randomBlocks(rng, q, Math.min(slab, n - off), 1 / Math.sqrt(s.inDim)), off);
      const x = f32(rows * s.inDim), o = f32(rows * s.outDim), nw = f32(s.inDim);
      be.write(x, Float32Array.from({ length: rows * s.inDim }, () => rng.normal()));
      be.write(nw, new Float32Array(s.inDim).fill(1));
      const run = () => be.run('fused_matmul', { x, weight: w, out: o, rows, inDim: s.inDim, outDim: s.outDim, ...(s.norm ? { normWeight: nw, eps: 1e-6 } : {}), ...(s.glu ? { glu: true } : {}) });
      for (let i = 0; i < 3; i++) run();
      be.synchronize('hard');
      const iters = Math.max(10, Math.round(2e10 / w.byteLength));
      const t0 = performance.now();
      for (let i = 0; i < iters; i++) run();
      be.synchronize('hard');
      const ms = (performance.now() - t0) / iters;
      const gbs = w.byteLength / (ms / 1000) / 1e9;
      const line = { probe: 'qgemv', type: q, shape: s.name, rows, inDim: s.inDim, outDim: s.outDim, glu: s.glu, weightBytes: w.byteLength, bytesPerElement: QUANT_BLOCKS[q].bytes / QUANT_BLOCKS[q].elements, us: +(ms * 1000).toFixed(1), GBs: +gbs.toFixed(1), copyGBs: +copyGBs.toFixed(1), fractionOfCopy: +(gbs / copyGBs).toFixed(3) };
      console.log(JSON.stringify(line));
      appendFileSync(path.join(out, 'qgemv.jsonl'), JSON.stringify(line) + '\n');
      for (const b of [w, x, o, nw]) be.free(b);
    }
  }
}
be.dispose();
