/**
 * The fabric report: topology, classification and a plan for every device pair and every device
 * to and from the host, in one JSON-serialisable object. The engine logs it at start and serves it
 * in GET /v1/memory; every degraded choice is in `degraded` with its notes.
 */
import type { BackendCapabilities, FabricKind } from '@nerva/core';
import { classifyFabric, deviceCount, type FabricClassification } from './classify.js';
import { planPath, type MeasureFn, type PathPlan } from './paths.js';
import { describeTopology, type FabricTopology } from './topology.js';

export interface FabricReport {
  /** `describeTopology`'s one line. */
  summary: string;
  fabric: FabricKind;
  topology: FabricTopology;
  classification: FabricClassification;
  /** gpu i -> gpu j for every ordered pair, then host -> gpu and gpu -> host for every device. */
  plans: PathPlan[];
  /** The plans that fell back, as 'gpu0 -> gpu1: pinned-bounce (reason...)'. */
  degraded: string[];
}

export interface FabricReportOptions {
  capabilities?: BackendCapabilities;
  /** Measurement hook; wrap in `measureOnce`. */
  measure?: MeasureFn;
  /** Transfer size plans are costed for (default 1 MiB). */
  bytes?: number;
}

/** Classify the fabric and plan every same-node path, measuring each candidate once. */
export function planFabric(topology: FabricTopology, options: FabricReportOptions = {}): FabricReport {
  const classification = classifyFabric(topology, options.capabilities);
  const plans: PathPlan[] = [];
  const onCpu = options.capabilities?.deviceKind === 'cpu';
  const n = onCpu ? 0 : deviceCount(topology);
  const planOpts = { capabilities: options.capabilities, measure: options.measure, bytes: options.bytes };
  for (let a = 0; a < n; a++)
    for (let b = 0; b < n; b++) if (a !== b) plans.push(planPath(topology, { kind: 'gpu', device: a }, { kind: 'gpu', device: b }, planOpts));
  for (let d = 0; d < n; d++) {
    plans.push(planPath(topology, { kind: 'host' }, { kind: 'gpu', device: d }, planOpts));
    plans.push(planPath(topology, { kind: 'gpu', device: d }, { kind: 'host' }, planOpts));
  }
  const key = (e: PathPlan['from']) => (e.kind === 'gpu' ? `gpu${e.device}` : e.kind);
  const degraded = plans
    .filter((p) => p.degraded)
    .map((p) => `${key(p.from)} -> ${key(p.to)}: ${p.chosen?.kind ?? 'no path'} (${p.notes.filter((t) => t.startsWith('degraded') || t.startsWith('no usable')).join('; ')})`);
  return { summary: describeTopology(topology), fabric: classification.fabric, topology, classification, plans, degraded };
}
