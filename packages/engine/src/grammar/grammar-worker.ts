/**
 * Grammar worker entry (a worker_threads Worker of a GrammarPool): its own XGrammar instance over
 * the model's vocabulary, the grammars it compiled (cached), and the matchers assigned to it.
 * Bundled as its own file (`dist/grammar-worker.js`).
 *
 * Starts come as messages and are answered as messages; advances come as messages too, but their
 * results go through each matcher's shared buffer (mask, status, then the sequence word), which
 * the step loop waits on without returning to its event loop. Every grammar is checked on a
 * scratch XGrammar instance of this thread first (checkGrammar), so a grammar that aborts XGrammar
 * kills that instance only, never the one holding the other requests' matchers.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { GrammarService } from './grammar-service.js';
import type { InThreadGrammarState } from './grammar-state.js';
import {
  C_BEAT,
  C_COMPILING,
  C_EXITED,
  CONTROL_WORDS,
  type FromGrammarWorker,
  type GrammarWorkerInit,
  H_SEQ,
  H_STATUS,
  H_TERMINATED,
  HEADER_WORDS,
  STATUS_FAILED,
  STATUS_OK,
  STATUS_REJECTED,
  type ToGrammarWorker,
  toWire,
} from './pool-protocol.js';

const port = parentPort;
if (!port) throw new Error('grammar-worker must run inside a worker thread');
const init = workerData as GrammarWorkerInit;
const service = new GrammarService(init.vocab, init.vocabSize, init.eosTokenIds);
const control = new Int32Array(init.control, init.index * CONTROL_WORDS * 4, CONTROL_WORDS);
const beat = () => Atomics.add(control, C_BEAT, 1);

/** Run `f` marked as compiling (the step loop then allows this worker a long silence). */
async function compiling<T>(f: () => Promise<T>): Promise<T> {
  Atomics.add(control, C_COMPILING, 1);
  try {
    return await f();
  } finally {
    Atomics.sub(control, C_COMPILING, 1);
  }
}

// The vocabulary is read now (~0.4 s for 151,936 ids), before the first start asks for it.
compiling(() => service.prepare()).catch(() => undefined);

interface Matcher {
  state: InThreadGrammarState;
  header: Int32Array;
}
const matchers = new Map<number, Matcher>();
/** Headers of every matcher started here (woken when this thread exits). */
const headers = new Map<number, Int32Array>();

const post = (m: FromGrammarWorker) => port.postMessage(m);

/** Publish an advance's result: status words first, the sequence word last (what the loop waits on). */
function publish(header: Int32Array, status: number, terminated: boolean): void {
  header[H_STATUS] = status;
  header[H_TERMINATED] = terminated ? 1 : 0;
  Atomics.add(header, H_SEQ, 1);
  Atomics.notify(header, H_SEQ);
  beat();
}

async function start(m: Extract<ToGrammarWorker, { op: 'start' }>): Promise<void> {
  const header = new Int32Array(m.shared, 0, HEADER_WORDS);
  headers.set(m.id, header);
  try {
    const compiled = await compiling(() => service.compile(m.grammar, m.param));
    const mask = new Int32Array(m.shared, HEADER_WORDS * 4);
    matchers.set(m.id, { state: compiled.start(m.stops, mask), header });
    post({ op: 'started', id: m.id });
  } catch (e) {
    headers.delete(m.id);
    post({ op: 'failed', id: m.id, error: toWire(e) });
  }
}

function advance(jobs: number[]): void {
  for (let j = 0; j + 1 < jobs.length; j += 2) {
    const id = jobs[j];
    const header = headers.get(id);
    if (!header) continue;
    const m = matchers.get(id);
    if (!m) {
      // Its instance aborted earlier (the matcher went with it).
      init.errors.postMessage({ id, error: { name: 'GrammarEngineError', code: 'ABORTED', message: 'the grammar engine instance of this request failed' } });
      publish(header, STATUS_FAILED, false);
      continue;
    }
    try {
      const ok = m.state.submit(jobs[j + 1]);
      publish(header, ok ? STATUS_OK : STATUS_REJECTED, m.state.terminated);
    } catch (e) {
      matchers.delete(id);
      init.errors.postMessage({ id, error: toWire(e) });
      publish(header, STATUS_FAILED, false);
    }
  }
}

port.on('message', (m: ToGrammarWorker) => {
  beat();
  switch (m.op) {
    case 'start':
      void start(m);
      return;
    case 'advance':
      advance(m.jobs);
      return;
    case 'free': {
      const x = matchers.get(m.id);
      matchers.delete(m.id);
      headers.delete(m.id);
      try {
        x?.state.dispose();
      } catch {
        // a matcher of an instance that aborted: nothing left to free
      }
      return;
    }
  }
});

// Whatever ends this thread, a step loop waiting on one of its matchers wakes and sees it.
process.on('exit', () => {
  Atomics.store(control, C_EXITED, 1);
  for (const h of headers.values()) Atomics.notify(h, H_SEQ);
});
