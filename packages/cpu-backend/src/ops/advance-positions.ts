import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/**
 * The device side of a decode step: positions[r] += 1, then slots[r] = the KV slot of the new
 * position through the row's block table. Every row is checked before any is changed, so a bad
 * row leaves positions and slots as they were.
 */
export function advancePositions(ctx: OpContext, a: OpArgs<'advance_positions'>): void {
  advanceStep(ctx, a)?.();
}

/**
 * advance_positions in two halves: the arguments and every row are checked now, the writes
 * happen when the returned function runs (undefined on a dry run), so an op that folds this one
 * in (sample's advance) checks it before writing anything of its own.
 */
export function advanceStep(ctx: OpContext, a: OpArgs<'advance_positions'>): (() => void) | undefined {
  const rows = ctx.count('rows', a.rows);
  const blockSize = ctx.count('blockSize', a.blockSize, 1);
  const maxBlocks = ctx.count('maxBlocksPerSeq', a.maxBlocksPerSeq, 1);
  const positions = ctx.ints('positions', a.positions, rows);
  const slots = ctx.ints('slots', a.slots, rows);
  const tables = ctx.ints('blockTables', a.blockTables, maxBlocks);
  const rowSeq = ctx.ints('rowSeq', a.rowSeq, rows);
  ctx.distinct('slots', a.slots, 'positions', a.positions);
  if (ctx.dry) return undefined;
  const numSeqs = Math.floor(tables.length / maxBlocks);
  for (let r = 0; r < rows; r++) {
    const seq = rowSeq[r];
    const pos = positions[r] + 1;
    if (seq < 0 || seq >= numSeqs) ctx.fail('rowSeq', `rowSeq[${r}] = ${seq} has no block table (${numSeqs} tables)`);
    if (positions[r] < 0 || pos >= maxBlocks * blockSize) ctx.fail('positions', `positions[${r}] + 1 = ${pos} is outside 0..${maxBlocks * blockSize - 1}`);
    const blk = tables[seq * maxBlocks + Math.floor(pos / blockSize)];
    // A negative entry is a block the host did not preallocate: a silent negative slot would make
    // kv_append drop this row's keys, so it is an error.
    if (blk < 0) ctx.fail('blockTables', `sequence ${seq} has no block for position ${pos} (entry ${Math.floor(pos / blockSize)} = ${blk})`);
  }
  return () => {
    for (let r = 0; r < rows; r++) {
      const pos = positions[r] + 1;
      positions[r] = pos;
      slots[r] = tables[rowSeq[r] * maxBlocks + Math.floor(pos / blockSize)] * blockSize + (pos % blockSize);
    }
  };
}
