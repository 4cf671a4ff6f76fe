export type { DeviceResidency, KvMemoryReport, KvTierPages, MemoryReport, PathTraffic, TierUsage, WeightFormat } from './report.js';
export * from './errors.js';
export * from './planner.js';
export * from './staging-ring.js';
export * from './spill.js';
export * from './weight-pager.js';
export * from './importance.js';
