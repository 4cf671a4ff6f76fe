// Pipeline parallelism, the one home of the stage concept: the layer split and the link
// interface (plan.ts), links over backends (links.ts), and the pipeline that runs the stages.
export * from './plan.js';
export * from './links.js';
export * from './pipeline.js';
