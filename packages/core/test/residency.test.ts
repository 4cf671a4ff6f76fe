import { describe, expect, it } from 'vitest';
import { canTransition, IllegalTransitionError, OwnershipError, RESIDENCY_TRANSITIONS, ResidentBlock, StaleReplicaError, type ResidencyState } from '../src/index.js';

const block = () => new ResidentBlock({ id: 'w0', kind: 'weight', bytes: 1024 });

function toReady(b: ResidentBlock, tier: 'vram' | 'dram' = 'vram'): void {
  b.transition(tier, 'Allocated');
  b.transition(tier, 'Prefetching');
  b.completePrefetch(tier);
}

describe('residency state machine', () => {
  it('walks the legal lifecycle Unmapped -> ... -> Unmapped', () => {
    const b = block();
    toReady(b);
    expect(b.state('vram')).toBe('Ready');
    b.acquire('vram', 0);
    expect(b.state('vram')).toBe('InUse');
    b.release('vram');
    b.transition('vram', 'Draining');
    b.transition('vram', 'Evicting');
    b.transition('vram', 'Unmapped');
    expect(b.tiers()).toEqual([]);
  });

  it('rejects every edge not in the table with a typed error and leaves the state as it was', () => {
    const states = Object.keys(RESIDENCY_TRANSITIONS) as ResidencyState[];
    let illegal = 0;
    for (const from of states) {
      for (const to of states) {
        if (canTransition(from, to)) continue;
        illegal++;
        const b = block();
        // Drive a fresh block to `from` along legal edges.
        const path: Record<ResidencyState, ResidencyState[]> = {
          Unmapped: [],
          Allocated: ['Allocated'],
          Prefetching: ['Allocated', 'Prefetching'],
          Ready: ['Allocated', 'Prefetching', 'Ready'],
          InUse: ['Allocated', 'Prefetching', 'Ready', 'InUse'],
          Draining: ['Allocated', 'Prefetching', 'Ready', 'Draining'],
          Evicting: ['Allocated', 'Prefetching', 'Ready', 'Draining', 'Evicting'],
          Invalid: ['Allocated', 'Prefetching', 'Ready', 'InUse', 'Invalid'],
        };
        for (const s of path[from]) b.transition('dram', s);
        expect(() => b.transition('dram', to)).toThrow(IllegalTransitionError);
        expect(b.state('dram')).toBe(from);
      }
    }
    expect(illegal).toBeGreaterThan(40);
  });

  it('an executor consumes only a Ready replica whose version satisfies its dependency', () => {
    const b = block();
    toReady(b, 'dram');
    const v1 = b.write('dram');
    expect(v1).toBe(1);
    toReady(b, 'vram');
    // The vram copy was made from version 1.
    expect(b.replica('vram')!.version).toBe(1);
    const v2 = b.write('dram');
    expect(() => b.acquire('vram', v2)).toThrow(StaleReplicaError);
    expect(b.acquire('dram', v2).version).toBe(2);
    b.release('dram');
    b.transition('vram', 'Draining');
    expect(() => b.acquire('vram', 0)).toThrow(/not Ready/);
  });

  it('a write elsewhere invalidates a replica that is in use', () => {
    const b = block();
    toReady(b, 'dram');
    toReady(b, 'vram');
    b.acquire('vram', 0);
    b.write('dram');
    expect(b.state('vram')).toBe('Invalid');
    b.transition('vram', 'Unmapped');
  });
});

describe('ownership phases', () => {
  it('hands off between owners only through Handoff, and never writes while shared', () => {
    const b = block();
    toReady(b, 'vram');
    expect(b.owner).toBe('CpuOwned');
    b.beginHandoff('GpuOwned');
    expect(() => b.write('vram')).toThrow(OwnershipError);
    expect(b.completeHandoff()).toBe('GpuOwned');
    b.write('vram');
    b.share();
    expect(() => b.write('vram')).toThrow(OwnershipError);
    expect(() => b.share()).toThrow(OwnershipError);
    b.beginHandoff('CpuOwned');
    expect(b.completeHandoff()).toBe('CpuOwned');
    expect(() => b.completeHandoff()).toThrow(/no handoff/);
  });
});
