// Token selection and the on-device decode loop: argmax, sampling, the token ring, positions.
import { type OpArgs } from '@nerva/core';
import { FLOAT, INT, type OpEncoders } from './encoder.js';

export const SAMPLE_ENCODERS: OpEncoders<'argmax' | 'sample' | 'ring_push' | 'advance_positions'> = {
  argmax(e, x, c, B) {
    const rows = c('rows'), vocab = c('vocab', 1);
    e.buf('logits', B('logits'), rows * vocab, FLOAT);
    e.buf('out', B('out'), rows, INT);
    e.num(rows); e.num(vocab);
  },
  sample(e, x, c, B) {
    const rows = c('rows'), vocab = c('vocab', 1);
    // Ids sampled are below limit (default vocab); vocab stays the row stride.
    const limit = x.limit === undefined ? vocab : e.count('limit', x.limit as number, 1);
    if (limit > vocab) e.fail(`limit must be at most vocab (${vocab}), got ${limit}`);
    e.reserve(40);
    e.buf('logits', B('logits'), rows * vocab, FLOAT);
    e.buf('params', B('params'), rows * 4, FLOAT);
    e.buf('rng', B('rng'), rows * 2, INT);
    e.buf('out', B('out'), rows, INT);
    e.num(rows); e.num(vocab); e.num(limit);
    // push, then advance: a flag each, then their buffers and numbers (as ops ring_push and
    // advance_positions take them; src and rows are the sampling's).
    const push = x.push as OpArgs<'sample'>['push'];
    if (push === undefined) e.num(0);
    else {
      if (push === null || typeof push !== 'object') e.fail('push must be { ring, cursor, capacity }');
      const cap = e.count('push.capacity', push.capacity, 1);
      if (rows > cap) e.fail(`${rows} rows exceed the ring capacity ${cap}`);
      e.num(1);
      e.buf('push.ring', push.ring, cap, INT);
      e.buf('push.cursor', push.cursor, 1, INT);
      e.num(cap);
    }
    const adv = x.advance as OpArgs<'sample'>['advance'];
    if (adv === undefined) e.num(0);
    else {
      if (adv === null || typeof adv !== 'object') e.fail('advance must be { positions, slots, blockTables, rowSeq, blockSize, maxBlocksPerSeq }');
      const bs = e.count('advance.blockSize', adv.blockSize, 1), mbps = e.count('advance.maxBlocksPerSeq', adv.maxBlocksPerSeq, 1);
      e.num(1);
      e.buf('advance.positions', adv.positions, rows, INT);
      e.buf('advance.slots', adv.slots, rows, INT);
      e.buf('advance.blockTables', adv.blockTables, mbps, INT);
      e.buf('advance.rowSeq', adv.rowSeq, rows, INT);
      e.num(bs); e.num(mbps);
    }
    // mask (constrained decoding), after advance: a flag, then bits, index, words and masks (the
    // whole masks bits holds: the device samples a row whose index names none as -1 rather than
    // read past bits). The addon reads it where it says sampleMask; an older one stops after
    // advance and never sees it (the backend refuses a mask there, so no row is ever sampled
    // unmasked by mistake).
    const mask = x.mask as OpArgs<'sample'>['mask'];
    if (mask === undefined) e.num(0);
    else {
      if (mask === null || typeof mask !== 'object') e.fail('mask must be { bits, index, words }');
      const words = e.count('mask.words', mask.words, 1);
      if (words * 32 < limit) e.fail(`mask.words must cover the ${limit} sampled ids (at least ${Math.ceil(limit / 32)}), got ${words}`);
      e.num(1);
      // bits: one mask per masked row at most (index values are the device's to read).
      e.buf('mask.bits', mask.bits, words, INT);
      e.buf('mask.index', mask.index, rows, INT);
      e.num(words);
      e.num(Math.floor(e.resolve(mask.bits, 'op sample: mask.bits').length / words));
    }
  },
  ring_push(e, x, c, B) {
    const rows = c('rows'), cap = c('capacity', 1);
    e.buf('src', B('src'), rows, INT);
    e.buf('ring', B('ring'), cap, INT);
    e.buf('cursor', B('cursor'), 1, INT);
    e.num(rows); e.num(cap);
  },
  advance_positions(e, x, c, B) {
    const rows = c('rows'), bs = c('blockSize', 1), mbps = c('maxBlocksPerSeq', 1);
    e.buf('positions', B('positions'), rows, INT);
    e.buf('slots', B('slots'), rows, INT);
    e.buf('blockTables', B('blockTables'), mbps, INT);
    e.buf('rowSeq', B('rowSeq'), rows, INT);
    e.num(rows); e.num(bs); e.num(mbps);
  },
};
