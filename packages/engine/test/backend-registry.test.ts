import { CpuBackend } from '@nerva/cpu-backend';
import { afterEach, describe, expect, it } from 'vitest';
import { BackendUnavailableError, backendFactory, registerBackend, registeredBackends, selectBackend, unregisterBackend } from '../src/index.js';

describe('backend registry', () => {
  afterEach(() => {
    unregisterBackend('fake');
    unregisterBackend('broken');
  });

  it('registers cuda and cpu by default, cuda tried first', () => {
    const names = registeredBackends().map((b) => b.name);
    expect(names.indexOf('cuda')).toBeLessThan(names.indexOf('cpu'));
    expect(backendFactory('cpu')).toBeDefined();
  });

  it('creates a registered kind by name, and auto takes the highest available priority, noting what it passed over', async () => {
    const made: string[] = [];
    registerBackend('fake', { probe: async () => ({ available: true }), create: async () => (made.push('fake'), { backend: new CpuBackend() }) }, 1000);
    const named = await selectBackend('fake' as 'cpu');
    expect(named.notes).toEqual([]);
    named.backend.dispose();
    registerBackend('broken', { probe: async () => ({ available: false, reason: 'no device' }), create: async () => ({ backend: new CpuBackend() }) }, 2000);
    const auto = await selectBackend('auto');
    expect(made).toEqual(['fake', 'fake']);
    expect(auto.notes).toEqual(['backend fallback: broken -> fake (no device)']);
    auto.backend.dispose();
    await expect(selectBackend('broken' as 'cpu')).rejects.toThrow(BackendUnavailableError);
    await expect(selectBackend('broken' as 'cpu')).rejects.toThrow('BROKEN backend unavailable: no device');
    await expect(selectBackend('nope' as 'cpu')).rejects.toThrow(/no backend 'nope' is registered/);
  });

  it('a failed creation is a reason to fall back, except for the reference backend', async () => {
    registerBackend('broken', { probe: async () => ({ available: true }), create: async () => Promise.reject(new Error('out of memory')) }, 2000);
    const auto = await selectBackend('auto');
    expect(auto.notes[0]).toMatch(/^backend fallback: broken -> (cuda|cpu) \(out of memory\)$/);
    auto.backend.dispose();
  });
});
