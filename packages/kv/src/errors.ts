import { NervaError } from '@nerva/core';

/** Identifier of a sequence (request) as the scheduler names it. */
export type SeqId = string | number;

/** Base class of every error raised by `@nerva/kv`; catch all of them with one `instanceof`. */
export class KvError extends NervaError {}

/** A constructor argument or call argument is out of its documented domain. */
export class KvArgumentError extends KvError {
  constructor(message: string) {
    super('KV_ARGUMENT', message);
  }
}

/** The sequence has no KV state in this manager (never admitted, or already freed long ago). */
export class UnknownSequenceError extends KvError {
  constructor(readonly seqId: SeqId) {
    super('KV_UNKNOWN_SEQUENCE', `sequence ${String(seqId)} has no KV blocks`);
  }
}

/** The sequence is already admitted; prefix lookup and admission happen once per (re-)admission. */
export class SequenceExistsError extends KvError {
  constructor(readonly seqId: SeqId) {
    super('KV_SEQUENCE_EXISTS', `sequence ${String(seqId)} already holds KV blocks`);
  }
}

/** A block or a sequence was freed twice. */
export class DoubleFreeError extends KvError {
  constructor(readonly what: string) {
    super('KV_DOUBLE_FREE', `double free: ${what}`);
  }
}

/** An allocation would give one sequence more blocks than `maxBlocksPerSeq` allows. */
export class MaxBlocksPerSeqError extends KvError {
  constructor(
    readonly seqId: SeqId,
    readonly requestedBlocks: number,
    readonly maxBlocksPerSeq: number,
  ) {
    super(
      'KV_MAX_BLOCKS_PER_SEQ',
      `sequence ${String(seqId)} would need ${requestedBlocks} blocks, more than maxBlocksPerSeq=${maxBlocksPerSeq}`,
    );
  }
}

/** The pool was asked for more blocks than it has free (callers are expected to check first). */
export class OutOfBlocksError extends KvError {
  constructor(
    readonly requested: number,
    readonly free: number,
  ) {
    super('KV_OUT_OF_BLOCKS', `requested ${requested} blocks, only ${free} free`);
  }
}

/**
 * Computed blocks from `getComputedBlocks` were evicted or re-registered before `allocateSlots`
 * used them (the scheduler let another allocation run in between).
 */
export class StaleComputedBlocksError extends KvError {
  constructor(readonly seqId: SeqId, detail: string) {
    super('KV_STALE_COMPUTED_BLOCKS', `sequence ${String(seqId)}: ${detail}`);
  }
}

/** A token position has no slot in the sequence's block table. */
export class SlotOutOfRangeError extends KvError {
  constructor(
    readonly seqId: SeqId,
    readonly position: number,
    readonly numTokens: number,
  ) {
    super(
      'KV_SLOT_OUT_OF_RANGE',
      `sequence ${String(seqId)}: position ${position} is outside [0, ${numTokens})`,
    );
  }
}

/** Misuse of the intrusive free-block queue (removing a block that is not queued, popping an empty queue). */
export class FreeQueueError extends KvError {
  constructor(message: string) {
    super('KV_FREE_QUEUE', message);
  }
}

/** One or more bookkeeping invariants are broken; `violations` lists each one. */
export class KvInvariantError extends KvError {
  constructor(readonly violations: readonly string[]) {
    super(
      'KV_INVARIANT',
      `${violations.length} KV invariant violation(s):\n  ${violations.slice(0, 20).join('\n  ')}`,
    );
  }
}
