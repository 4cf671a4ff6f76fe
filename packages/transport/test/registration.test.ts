import { HotPathAllocationError, NervaError } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import {
  HotPathRegistrationError,
  RegistrationCache,
  RegistrationRangeError,
  StaleRegistrationError,
  TransportArgumentError,
  UnknownRegistrationError,
  type Registration,
} from '../src/index.js';

describe('RegistrationCache', () => {
  it('registers before the hot path and resolves during it', () => {
    const native: string[] = [];
    const cache = new RegistrationCache({ register: (d) => (native.push(`reg ${String(d.id)}`), `mr-${String(d.id)}`) });
    const r = cache.register({ id: 'staging', bytes: 4096, generation: 1, address: 0x7f00_0000n });
    expect(r).toMatchObject({ id: 'staging', bytes: 4096, generation: 1, address: 0x7f00_0000n, native: 'mr-staging', state: 'live', handle: 1 });
    cache.setHotPath(true);
    expect(cache.resolve('staging', 1)).toBe(r);
    expect(cache.resolve('staging', 1, { offset: 1024, bytes: 3072 })).toBe(r);
    expect(native).toEqual(['reg staging']);
    expect(cache.stats()).toMatchObject({ live: 1, liveBytes: 4096, lookups: 2, registrations: 1, hotPathRejections: 0 });
  });

  it('rejects a stale registration after the buffer is reallocated (new generation)', () => {
    const cache = new RegistrationCache();
    cache.register({ id: 7, bytes: 256, generation: 3 });
    let err: unknown;
    try {
      cache.resolve(7, 4);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StaleRegistrationError);
    expect(err).toBeInstanceOf(NervaError);
    expect((err as StaleRegistrationError).code).toBe('STALE_REGISTRATION');
    expect((err as Error).message).toBe('buffer 7: registration of generation 3 is stale (the buffer is now generation 4)');
    expect(cache.stats().staleRejections).toBe(1);
  });

  it('rejects a registration whose buffer was freed, until it is registered again', () => {
    const dereg: Registration[] = [];
    const cache = new RegistrationCache({ deregister: (r) => dereg.push(r) });
    cache.register({ id: 'kv', bytes: 1 << 20, generation: 1 });
    expect(cache.invalidate('kv')).toBe(true);
    expect(dereg.map((r) => r.generation)).toEqual([1]);
    expect(() => cache.resolve('kv', 1)).toThrow(/the buffer was freed/);
    expect(cache.peek('kv')?.state).toBe('stale');
    expect(cache.invalidate('kv')).toBe(false);
    expect(cache.stats()).toMatchObject({ live: 0, stale: 1 });
    const again = cache.register({ id: 'kv', bytes: 1 << 20, generation: 2 });
    expect(cache.resolve('kv', 2)).toBe(again);
    expect(() => cache.resolve('kv', 1)).toThrow(StaleRegistrationError);
  });

  it('an invalidation that names the new generation refuses re-registering the old one', () => {
    const cache = new RegistrationCache();
    cache.register({ id: 'a', bytes: 8, generation: 1 });
    cache.invalidate('a', 2);
    expect(() => cache.resolve('a', 2)).toThrow(/now generation 2/);
    expect(() => cache.register({ id: 'a', bytes: 8, generation: 1 })).toThrow(StaleRegistrationError);
    cache.register({ id: 'a', bytes: 8, generation: 2 });
    expect(cache.resolve('a', 2).generation).toBe(2);
  });

  it('replaces an older generation on register, deduplicates an identical one, refuses an older one', () => {
    const calls: string[] = [];
    const cache = new RegistrationCache({ register: (d) => calls.push(`+${d.generation}`), deregister: (r) => calls.push(`-${r.generation}`) });
    const a = cache.register({ id: 'x', bytes: 64, generation: 1 });
    expect(cache.register({ id: 'x', bytes: 64, generation: 1 })).toBe(a);
    const b = cache.register({ id: 'x', bytes: 128, generation: 2 });
    expect(b.handle).toBe(2);
    expect(() => cache.register({ id: 'x', bytes: 64, generation: 1 })).toThrow(StaleRegistrationError);
    expect(calls).toEqual(['+1', '-1', '+2']);
    expect(cache.stats()).toMatchObject({ registrations: 2, duplicates: 1, live: 1, liveBytes: 128 });
  });

  it('rejects and counts registration while the hot-path guard is armed', () => {
    const cache = new RegistrationCache();
    cache.register({ id: 'x', bytes: 64, generation: 1 });
    cache.setHotPath(true);
    expect(cache.hotPathArmed).toBe(true);
    let err: unknown;
    try {
      cache.register({ id: 'y', bytes: 64, generation: 1 });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(HotPathRegistrationError);
    expect(err).toBeInstanceOf(HotPathAllocationError);
    expect((err as HotPathAllocationError).code).toBe('HOT_PATH_ALLOCATION');
    expect(() => cache.unregister('x')).toThrow(HotPathRegistrationError);
    expect(cache.stats().hotPathRejections).toBe(2);
    expect(() => cache.resolve('y', 1)).toThrow(UnknownRegistrationError);
    cache.setHotPath(false);
    expect(cache.unregister('x')).toBe(true);
    expect(cache.unregister('x')).toBe(false);
  });

  it('checks ranges and arguments', () => {
    const cache = new RegistrationCache();
    cache.register({ id: 1, bytes: 100, generation: 0 });
    expect(() => cache.resolve(1, 0, { offset: 90, bytes: 20 })).toThrow(RegistrationRangeError);
    expect(() => cache.resolve(1, 0, { offset: -1, bytes: 1 })).toThrow(/outside the registered 100 bytes/);
    expect(cache.stats().rangeRejections).toBe(2);
    expect(() => cache.register({ id: 2, bytes: 0, generation: 0 })).toThrow(TransportArgumentError);
    expect(() => cache.register({ id: 2, bytes: 1.5, generation: 0 })).toThrow(TransportArgumentError);
    expect(() => cache.register({ id: 2, bytes: 8, generation: -1 })).toThrow(/generation/);
    expect(() => cache.register({ id: NaN, bytes: 8, generation: 0 })).toThrow(/buffer id/);
    expect(() => cache.resolve('nope', 0)).toThrow(UnknownRegistrationError);
    expect(cache.stats().unknownLookups).toBe(1);
  });

  it('prunes stale entries', () => {
    const cache = new RegistrationCache();
    cache.register({ id: 1, bytes: 8, generation: 0 });
    cache.register({ id: 2, bytes: 8, generation: 0 });
    cache.invalidate(1);
    expect(cache.pruneStale()).toBe(1);
    expect(() => cache.resolve(1, 0)).toThrow(UnknownRegistrationError);
    expect(cache.stats()).toMatchObject({ live: 1, stale: 0 });
  });
});
