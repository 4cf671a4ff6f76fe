import type { TokenLedgerRecord } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import type { StepSignals, TokenEvent, WorkerBatch, WorkerOutcome } from '../src/index.js';
import { TokenStream } from '../src/index.js';
import { Outbox } from '../src/worker/outbox.js';

const ev = (requestId: number, index: number, token: number): TokenEvent => ({ requestId, index, token, text: `t${token}`, ledger: { wallMs: 1 } as TokenLedgerRecord });
const sig = (time: number): StepSignals => ({
  time,
  running: 2,
  waiting: 0,
  kvUsage: 0.1,
  prefixQueries: 0,
  prefixHits: 0,
  preemptions: 0,
  scheduledTokens: 2,
  promptTokens: 0,
  generationTokens: 2,
  stepMs: 1,
  sharedBlocks: 0,
  sharedBlockReads: 0,
  droppedSteps: 0,
  enqueuedAhead: false,
});
const outcome = (requestId: number) => ({ requestId, finishReason: 'length' }) as unknown as WorkerOutcome;

describe('TokenStream.pipeTo', () => {
  it('hands queued items first, then each push at once, then the end with its error', () => {
    const s = new TokenStream<number>();
    s.push(1);
    s.push(2);
    const got: (number | string)[] = [];
    s.pipeTo({ push: (x) => got.push(x), end: (e) => got.push(`end:${e?.message ?? ''}`) });
    expect(got).toEqual([1, 2]);
    s.push(3);
    expect(got).toEqual([1, 2, 3]);
    s.end(new Error('boom'));
    s.push(4);
    expect(got).toEqual([1, 2, 3, 'end:boom']);
    expect(() => s.pipeTo({ push: () => {}, end: () => {} })).toThrow(/already piped/);
  });

  it('a stream that ended before it was piped delivers its items and its end', () => {
    const s = new TokenStream<number>();
    s.push(7);
    s.end();
    const got: unknown[] = [];
    s.pipeTo({ push: (x) => got.push(x), end: (e) => got.push(e ?? 'end') });
    expect(got).toEqual([7, 'end']);
  });
});

describe('Outbox', () => {
  it('what one synchronous step produces leaves as one message after it, in order, with the load at posting time', async () => {
    const posted: WorkerBatch[] = [];
    let running = 2;
    const box = new Outbox((m) => posted.push(m), () => ({ running, waiting: 0, kvUsage: 0.5 }));
    // One step: two requests' tokens, one of them finishing, then the step's signals.
    box.event(11, ev(1, 4, 40));
    box.event(12, ev(2, 0, 50));
    box.event(11, ev(1, 5, 41));
    box.done(11, outcome(1));
    box.step(sig(1));
    running = 1;
    expect(posted).toHaveLength(0);
    await Promise.resolve();
    expect(posted).toHaveLength(1);
    const m = posted[0];
    expect(m.type).toBe('batch');
    expect(m.rids).toEqual([11, 12, 11]);
    expect(m.events.map((e) => e.token)).toEqual([40, 50, 41]);
    expect(m.ends).toEqual([{ rid: 11, outcome: outcome(1) }]);
    expect(m.steps.map((s) => s.time)).toEqual([1]);
    expect(m.load.running).toBe(1);
    // The next step is a message of its own.
    box.event(12, ev(2, 1, 51));
    box.failed(12, { name: 'EngineError', message: 'x', code: 'X' });
    await Promise.resolve();
    expect(posted).toHaveLength(2);
    expect(posted[1].events.map((e) => e.token)).toEqual([51]);
    expect(posted[1].ends).toEqual([{ rid: 12, error: { name: 'EngineError', message: 'x', code: 'X' } }]);
    expect(posted[1].steps).toEqual([]);
  });

  it('flush posts what waits at once (before another message), and nothing when nothing waits', async () => {
    const posted: WorkerBatch[] = [];
    const box = new Outbox((m) => posted.push(m), () => ({ running: 0, waiting: 0, kvUsage: 0 }));
    box.flush();
    expect(posted).toHaveLength(0);
    box.event(3, ev(1, 0, 9));
    expect(box.pending).toBe(true);
    box.flush();
    expect(posted).toHaveLength(1);
    expect(box.pending).toBe(false);
    await Promise.resolve();
    // The microtask queued by the event finds nothing left to post.
    expect(posted).toHaveLength(1);
  });
});
