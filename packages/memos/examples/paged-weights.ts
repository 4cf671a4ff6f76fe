import { CpuBackend } from '@nerva/cpu-backend';
import { type PagedTensor, type PagerStats, planResidency, WeightPager } from '@nerva/memos';

/** Eight 16 KiB layers and a 16 KiB embedding in a 64 KiB compute tier: plan, then stream passes. */
export function pagedWeights(passes = 3): { hot: string[]; streamed: readonly string[]; notes: string[]; firstValues: number[]; stats: PagerStats } {
  const layout: PagedTensor[] = [{ name: 'w', dtype: 'f32', length: 4096 }]; // one layer's tensors
  const blocks = [
    { id: 'embed', bytes: 16384 }, // no order: used every pass outside the stream, always hot
    ...Array.from({ length: 8 }, (_, i) => ({ id: `layer.${i}`, bytes: 16384, order: i })),
  ];
  const plan = planResidency({ blocks, deviceBytes: 65536, slots: 2 });
  const hot = [...plan.placements.values()].filter((p) => p.placement === 'hot').map((p) => p.id);
  // plan.notes[0]: 'paged weights: 1 of 8 layer blocks hot (32.00 KiB), 7 streamed (112.00 KiB) through 2 slots of 16.00 KiB'

  // The compute tier is exactly the budget: the hot blocks and the ring fill it.
  const backend = new CpuBackend({ memoryBytes: 65536, hostMemoryBytes: 2 ** 20 });
  const hotBuffers = hot.map((id) => backend.alloc({ dtype: 'f32', length: 4096, usage: 'weights', label: id }));
  const pager = new WeightPager({ backend, plan, layout, hostTier: 'pinned' });
  plan.streamed.forEach((id, i) => pager.store(id, 'w', new Float32Array(4096).fill(i + 1)));
  pager.prime(); // the first two loads, once

  const firstValues: number[] = [];
  for (let pass = 0; pass < passes; pass++) {
    for (const id of plan.streamed) {
      const { w } = pager.acquire(id); // the slot holding this layer, ready for work enqueued next
      firstValues.push(backend.read(w, 0, 1)[0]); // a model would enqueue the layer's ops here
      pager.release(id); // the slot takes the block two places later
    }
    pager.endPass();
  }
  const stats = pager.stats(); // passes 3, loads 2 + 3 x 7, hits 21, stalls 0
  pager.dispose();
  for (const b of hotBuffers) backend.free(b);
  backend.dispose();
  return { hot, streamed: plan.streamed, notes: plan.notes, firstValues, stats };
}
