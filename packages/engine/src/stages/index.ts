// Pipeline parallelism, the one home of the stage concept: the layer split and the link
// interface (plan.ts), links over backends (links.ts), where stages run (placement.ts), and the
// pipeline that runs them.
export * from './plan.js';
export * from './links.js';
export * from './placement.js';
export * from './pipeline.js';
// Tensor parallelism: every layer split across shards (shard-weights.ts, shard-runner.ts), their
// slices all-gathered over the same stage links (all-gather.ts), run as one group (tensor-parallel.ts).
export * from './all-gather.js';
export * from './shard-weights.js';
export * from './shard-runner.js';
export { isPreparedShards, prepareShards, primaryShardBudget, tensorParallelRequest, TensorParallelGroup, type PreparedShards, type PrepareShardsArgs, type TensorParallelDescription, type TensorParallelOptions, type TensorParallelRequest } from './tensor-parallel.js';
