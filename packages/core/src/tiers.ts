/** Where a replica of a block lives. Ordered from fastest to slowest for the device. */
export const TIERS = ['vram', 'pinned', 'dram', 'disk', 'cxl'] as const;
export type Tier = (typeof TIERS)[number];

export function isTier(x: unknown): x is Tier {
  return typeof x === 'string' && (TIERS as readonly string[]).includes(x);
}
