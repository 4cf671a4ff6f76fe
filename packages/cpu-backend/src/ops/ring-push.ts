import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/** ring[(cursor + r) % capacity] = src[r], then cursor += rows (int32 arithmetic, as on a device). */
export function ringPush(ctx: OpContext, a: OpArgs<'ring_push'>): void {
  const rows = ctx.count('rows', a.rows);
  const capacity = ctx.count('capacity', a.capacity, 1);
  // More rows than slots would overwrite tokens of this very push before anyone observed them.
  if (rows > capacity) ctx.fail('rows', `${rows} rows exceed the ring capacity ${capacity}`);
  const src = ctx.ints('src', a.src, rows);
  const ring = ctx.ints('ring', a.ring, capacity);
  const cursor = ctx.ints('cursor', a.cursor, 1);
  ctx.distinct('ring', a.ring, 'src', a.src);
  if (ctx.dry) return;
  const c = cursor[0];
  for (let r = 0; r < rows; r++) {
    const i = (((c + r) % capacity) + capacity) % capacity;
    ring[i] = src[r];
  }
  cursor[0] = (c + rows) | 0;
}
