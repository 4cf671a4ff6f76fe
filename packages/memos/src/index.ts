
export type { MemoryReport, PathTraffic, TierUsage } from './report.js';
