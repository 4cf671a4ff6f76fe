/**
 * @nerva/transport: fabric discovery from Linux sysfs, classification into the fabric kinds of
 * `@nerva/core`, transfer path planning with explicit fallbacks, the registration cache, and
 * the order of devices along a pipeline.
 */
export * from './errors.js';
export * from './sysfs.js';
export * from './pci-ids.js';
export * from './topology.js';
export * from './classify.js';
export * from './paths.js';
export * from './registration.js';
export * from './pipeline-order.js';
export * from './report.js';
