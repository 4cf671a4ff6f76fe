import type { KvCacheManager } from '@nerva/kv';
import { describe, expect, it } from 'vitest';
import type { Request } from '../src/request.js';
import { passKey, RowLayout } from '../src/row-layout.js';
import type { ScheduledRequest } from '../src/scheduler.js';

// RowLayout only needs a request's identity (and passKey its id and table length).
const req = (id: number) => ({ id }) as unknown as Request;
const row = (r: Request): ScheduledRequest => ({ req: r, numTokens: 1 });
const tables = new Map<number, number[]>();
const kv = { blockTable: (id: number) => tables.get(id) ?? [] } as unknown as KvCacheManager;

describe('RowLayout (a decode batch whose finished rows stay in place)', () => {
  const [a, b, c, d] = [1, 2, 3, 4].map(req);

  it('arranges nothing before a graph step placed its rows', () => {
    const l = new RowLayout();
    expect(l.arrange([row(a)], 1)).toBeUndefined();
  });

  it('keeps the places of the rows left, a hole where one finished, in the layout order whatever the scheduler order', () => {
    const l = new RowLayout();
    l.place([row(a), row(b), row(c), row(d)], 4);
    const order = l.arrange([row(d), row(a), row(c)], 4)!;
    expect(order.map((s) => s?.req.id)).toEqual([1, undefined, 3, 4]);
    // Placing that order makes the hole a pad row; the finished request keeps its place.
    l.place(order, 4);
    expect([0, 1, 2, 3].map((k) => l.isPad(k))).toEqual([false, true, false, false]);
    expect(l.arrange([row(c)], 4)!.map((s) => s?.req.id)).toEqual([undefined, undefined, 3, undefined]);
  });

  it('compacts (arranges nothing) for a row it does not hold or another bucket', () => {
    const l = new RowLayout();
    l.place([row(a), row(b), row(c)], 4);
    expect(l.arrange([row(a), row(req(9))], 4)).toBeUndefined();
    expect(l.arrange([row(a)], 1)).toBeUndefined();
    l.clear();
    expect(l.bucket).toBe(0);
    expect(l.arrange([row(a)], 4)).toBeUndefined();
  });

  it('setPad marks a row the device computes as padding until the next placement says otherwise', () => {
    const l = new RowLayout();
    l.place([row(a), row(b)], 2);
    l.setPad(1);
    expect(l.isPad(1)).toBe(true);
    l.place([row(a), row(b)], 2);
    expect(l.isPad(1)).toBe(false);
  });
});

describe('passKey', () => {
  it("names each row's request and table length, '-' for a hole or a row the caller calls padding", () => {
    tables.set(1, [5, 6]);
    tables.set(3, [7]);
    const order = [row(req(1)), undefined, row(req(3))];
    expect(passKey(kv, 4, false, order)).toBe('4|false|1:2,-,3:1');
    expect(passKey(kv, 4, false, order, (k) => k === 2)).toBe('4|false|1:2,-,-');
    // A row's new block is a new pass (its advance reads the table).
    tables.set(3, [7, 8]);
    expect(passKey(kv, 4, false, order)).toBe('4|false|1:2,-,3:2');
  });
});
