import type { BackendCapabilities } from '@nerva/core';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { createSysfsReader, discoverTopology, type FabricTopology, type RuntimeProbe, type SysfsReader } from '../src/index.js';

/**
 * The sysfs trees under test/fixtures, each with the runtime probe it goes with: h100-recorded was
 * recorded on a real machine, the others are modelled (see fixtures/README.md).
 */
export const FIXTURES = ['h100-recorded', 'h100-sxm-vm', 'h200-nvlink-2gpu', 'pcie-2gpu-iommu', 'malformed'] as const;
export type FixtureName = (typeof FIXTURES)[number];

export function fixtureRoot(name: string): string {
  return fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url));
}

export function fixtureReader(name: string): SysfsReader {
  return createSysfsReader(fixtureRoot(name));
}

/** The fixture's runtime.json, or undefined where it has none (malformed). */
export function fixtureRuntime(name: string): RuntimeProbe | undefined {
  try {
    return JSON.parse(readFileSync(`${fixtureRoot(name)}/runtime.json`, 'utf8')) as RuntimeProbe;
  } catch {
    return undefined;
  }
}

export function loadFixture(name: string, runtime: RuntimeProbe | undefined | null = fixtureRuntime(name)): FabricTopology {
  return discoverTopology(fixtureReader(name), { runtime: runtime ?? undefined });
}

/** A square matrix of one value with a given diagonal. */
export function matrix<T>(n: number, value: T, diagonal: T): T[][] {
  return Array.from({ length: n }, (_, i) => Array.from({ length: n }, (_, j) => (i === j ? diagonal : value)));
}

/** Capabilities of a CUDA-like backend; override what a test varies. */
export function caps(over: Partial<BackendCapabilities> = {}): BackendCapabilities {
  return {
    deviceKind: 'cuda',
    deviceName: 'test',
    deviceCount: 2,
    memory: { vram: 80e9, pinned: 1e9 },
    computeTier: 'vram',
    dtypes: ['f32', 'bf16'],
    weightDtype: 'bf16',
    precision: { compute: 'f32', relTol: 1e-3 },
    graphCapture: true,
    peerAccess: true,
    collectives: true,
    fabric: 'DiscreteExplicit',
    ops: [],
    ...over,
  };
}
