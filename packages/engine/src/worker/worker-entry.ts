/**
 * Worker-thread entry: owns one {@link Engine}, so its synchronous forward passes never block
 * the thread that serves HTTP. Bundled as its own file (`dist/worker-entry.js`) and started by
 * {@link WorkerEngine}. Messages are handled between scheduler steps (the engine yields to the
 * event loop after each step), so an abort frees its KV blocks within one step.
 */
import { parentPort, workerData } from 'node:worker_threads';
import '../default-backends.js';
import { Engine, EngineError, type RequestHandle } from '../engine.js';
import { ENGINE_QUERIES, engineInfo, type FromWorker, type ToWorker, toWire, type WorkerEngineOptions, type WorkerLoad } from './protocol.js';

const port = parentPort;
if (!port) throw new Error('worker-entry must run inside a worker thread');
const post = (m: FromWorker) => port.postMessage(m);

let engine: Engine;
try {
  engine = await Engine.create(workerData as WorkerEngineOptions);
} catch (e) {
  post({ type: 'initError', error: toWire(e) });
  port.close();
  process.exit(0);
}

const live = new Map<number, RequestHandle>();
/** Embed calls running, by query id: their aborts. */
const embeds = new Map<number, AbortController>();
const load = (): WorkerLoad => ({ running: engine.numRunning, waiting: engine.numWaiting, kvUsage: engine.kv.usage });

engine.onStep((signals) => post({ type: 'step', signals }));

async function run(rid: number, h: RequestHandle): Promise<void> {
  try {
    for await (const event of h.events) post({ type: 'event', rid, event });
    const o = await h.done;
    const { ledger, promptLogits: _drop, ...rest } = o;
    post({ type: 'done', rid, outcome: { ...rest, promptIds: [...o.promptIds], ledger: ledger.summary() }, load: load() });
  } catch (e) {
    post({ type: 'failed', rid, error: toWire(e), load: load() });
  } finally {
    live.delete(rid);
  }
}

port.on('message', (m: ToWorker) => {
  switch (m.type) {
    case 'submit': {
      let h: RequestHandle;
      try {
        h = engine.submit(m.promptIds, m.opts);
      } catch (e) {
        post({ type: 'failed', rid: m.rid, error: toWire(e), load: load() });
        return;
      }
      live.set(m.rid, h);
      void run(m.rid, h);
      return;
    }
    case 'submitFork': {
      let hs: RequestHandle[];
      try {
        hs = engine.submitFork(m.promptIds, m.rids.length, m.opts);
      } catch (e) {
        for (const rid of m.rids) post({ type: 'failed', rid, error: toWire(e), load: load() });
        return;
      }
      hs.forEach((h, i) => {
        live.set(m.rids[i], h);
        void run(m.rids[i], h);
      });
      return;
    }
    case 'abort':
      live.get(m.rid)?.abort();
      return;
    case 'embed': {
      const ac = new AbortController();
      embeds.set(m.qid, ac);
      engine.embed(m.inputs, { ...m.opts, signal: ac.signal }).then(
        (value) => post({ type: 'reply', qid: m.qid, value }),
        (e: unknown) => post({ type: 'reply', qid: m.qid, error: toWire(e) }),
      ).finally(() => embeds.delete(m.qid));
      return;
    }
    case 'abortEmbed':
      embeds.get(m.qid)?.abort(new EngineError('ABORTED', 'embed aborted'));
      return;
    case 'query':
      try {
        post({ type: 'reply', qid: m.qid, value: ENGINE_QUERIES[m.what](engine, load()) });
      } catch (e) {
        post({ type: 'reply', qid: m.qid, error: toWire(e) });
      }
      return;
    case 'fault':
      if (m.what === 'exit') process.exit(3);
      // A step that never returns: only terminate() ends it.
      for (;;);
    case 'dispose':
      engine.dispose();
      post({ type: 'disposed' });
      port.close();
      return;
  }
});

post({ type: 'ready', info: engineInfo(engine) });
