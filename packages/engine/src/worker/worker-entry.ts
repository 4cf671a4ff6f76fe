/**
 * Worker-thread entry: owns one {@link Engine}, so its synchronous forward passes never block
 * the thread that serves HTTP. Bundled as its own file (`dist/worker-entry.js`) and started by
 * {@link WorkerEngine}. Messages are handled between scheduler steps (the engine yields to the
 * event loop after each step), so an abort frees its KV blocks within one step.
 */
import { parentPort, workerData } from 'node:worker_threads';
import '../default-backends.js';
import { Engine, EngineError, type RequestHandle } from '../engine.js';
import { TokenStream } from '../token-stream.js';
import { Outbox } from './outbox.js';
import { ENGINE_QUERIES, engineInfo, type FromWorker, type ToWorker, toWire, type WorkerEngineOptions, type WorkerLoad } from './protocol.js';

const port = parentPort;
if (!port) throw new Error('worker-entry must run inside a worker thread');
/** Every message but the batches goes after what the outbox holds, so the receiver sees all in order. */
const post = (m: FromWorker) => {
  if (m.type !== 'batch') outbox.flush();
  port.postMessage(m);
};

let engine: Engine;
try {
  engine = await Engine.create(workerData as WorkerEngineOptions);
} catch (e) {
  port.postMessage({ type: 'initError', error: toWire(e) } satisfies FromWorker);
  port.close();
  process.exit(0);
}

const live = new Map<number, RequestHandle>();
/** The main thread's id of each live request, by the engine's request id (finish listeners name the latter). */
const ridOf = new Map<number, number>();
/** Embed calls running, by query id: their aborts. */
const embeds = new Map<number, AbortController>();
const load = (): WorkerLoad => ({ running: engine.numRunning, waiting: engine.numWaiting, kvUsage: engine.kv.usage });
const outbox = new Outbox((m) => port.postMessage(m), load);

engine.onStep((signals) => outbox.step(signals));
// A request that finishes (by a stop, its length or an abort) ends its stream and then calls the
// finish listeners, synchronously, inside the step: its outcome joins the step's batch.
engine.onFinish((o) => {
  const rid = ridOf.get(o.requestId);
  if (rid === undefined) return;
  forget(rid, o.requestId);
  const { ledger, promptLogits: _drop, ...rest } = o;
  outbox.done(rid, { ...rest, promptIds: [...o.promptIds], ledger: ledger.summary() });
});

function forget(rid: number, engineId: number): void {
  live.delete(rid);
  ridOf.delete(engineId);
}

/** Forward a request's events to the outbox as the engine emits them (no promise per token); a stream that ends with an error fails it. */
function track(rid: number, h: RequestHandle): void {
  live.set(rid, h);
  ridOf.set(h.id, rid);
  if (!(h.events instanceof TokenStream)) throw new Error('engine handles stream through a TokenStream');
  h.events.pipeTo({
    push: (ev) => outbox.event(rid, ev),
    end: (err) => {
      if (!err) return;
      forget(rid, h.id);
      outbox.failed(rid, toWire(err));
    },
  });
}

port.on('message', (m: ToWorker) => {
  switch (m.type) {
    case 'submit': {
      let h: RequestHandle;
      try {
        h = engine.submit(m.promptIds, m.opts);
      } catch (e) {
        outbox.failed(m.rid, toWire(e));
        return;
      }
      track(m.rid, h);
      return;
    }
    case 'submitFork': {
      let hs: RequestHandle[];
      try {
        hs = engine.submitFork(m.promptIds, m.rids.length, m.opts);
      } catch (e) {
        for (const rid of m.rids) outbox.failed(rid, toWire(e));
        return;
      }
      hs.forEach((h, i) => track(m.rids[i], h));
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
