import type { MessagePort } from 'node:worker_threads';
import { NervaError } from '@nerva/core';
import { InvalidParamsError } from '../sampling-params.js';
import type { GrammarSpec } from './spec.js';
import type { EncodedVocab } from './vocab.js';
import { GrammarEngineError } from './xgrammar-runtime.js';

/**
 * What the step loop and a grammar worker share about one matcher: a SharedArrayBuffer of
 * HEADER_WORDS int32 words, then the mask. The worker writes the mask and the status, then bumps
 * the sequence word (Atomics.store, Atomics.notify); the loop waits on that word (Atomics.wait).
 */
export const HEADER_WORDS = 3;
/** Advances completed (the loop waits until it equals the advances it handed over). */
export const H_SEQ = 0;
/** Status of the last advance (STATUS_*). */
export const H_STATUS = 1;
/** 1 once the matcher accepted a stop token. */
export const H_TERMINATED = 2;

export const STATUS_OK = 0;
/** The matcher did not take the token (its mask allowed it: a grammar engine fault). */
export const STATUS_REJECTED = 1;
/** The grammar engine failed; the error is on the worker's error port, tagged with the matcher id. */
export const STATUS_FAILED = 2;

/**
 * A worker's control words (CONTROL_WORDS int32 a worker, in a buffer the pool shares with every
 * worker): what the step loop reads while it waits, since a worker's exit reaches the loop only
 * through its event loop, which a waiting step holds.
 */
export const CONTROL_WORDS = 3;
/** Set when the worker's thread exits (where its exit handler runs: not on terminate()). */
export const C_EXITED = 0;
/** Compiles (and the vocabulary build) in progress: a worker may be silent for seconds then. */
export const C_COMPILING = 1;
/** Bumped after each message and each advance the worker handles: it is alive while this moves. */
export const C_BEAT = 2;

/** Bytes of one matcher's shared buffer for masks of `words` words. */
export function sharedBytes(words: number): number {
  return (HEADER_WORDS + words) * 4;
}

/** A worker's start data. */
export interface GrammarWorkerInit {
  vocab: EncodedVocab;
  vocabSize: number;
  eosTokenIds: number[];
  /** The port advance errors go to (the loop reads it synchronously, receiveMessageOnPort). */
  errors: MessagePort;
  /** The pool's control words (CONTROL_WORDS a worker; this worker's at index * CONTROL_WORDS). */
  control: SharedArrayBuffer;
  index: number;
}

export type ToGrammarWorker =
  /** Compile (cached) and start a matcher whose first mask goes into `shared`. */
  | { op: 'start'; id: number; grammar: GrammarSpec; param: string; stops: number[]; shared: SharedArrayBuffer }
  /** Advance matchers: [id, token] pairs, in order. */
  | { op: 'advance'; jobs: number[] }
  | { op: 'free'; id: number };

export type FromGrammarWorker = { op: 'started'; id: number } | { op: 'failed'; id: number; error: WireError };

/** An advance's error, on the error port. */
export interface AdvanceError {
  id: number;
  error: WireError;
}

/** An error as it crosses threads. */
export interface WireError {
  name: string;
  code?: string;
  param?: string;
  message: string;
}

export function toWire(e: unknown): WireError {
  if (e instanceof InvalidParamsError) return { name: 'InvalidParamsError', code: e.code, param: e.param, message: e.message };
  if (e instanceof NervaError) return { name: e.name, code: e.code, message: e.message };
  return { name: 'Error', message: e instanceof Error ? e.message : String(e) };
}

/** The error a wire error stands for: InvalidParamsError keeps its param; the rest are GrammarEngineError. */
export function fromWire(w: WireError): Error {
  if (w.name === 'InvalidParamsError' && w.param !== undefined) {
    const prefix = `${w.param}: `;
    return new InvalidParamsError(w.param, w.message.startsWith(prefix) ? w.message.slice(prefix.length) : w.message);
  }
  return new GrammarEngineError(w.code ?? 'GRAMMAR_WORKER', w.message);
}
