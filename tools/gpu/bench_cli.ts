// GPU machine: the `nerva-bench` CLI itself (packages/bench/src/cli.ts), bundled so it runs there
// (phase `throughput` of run.sh: `bench_cli.mjs throughput ...`).
import '../../packages/bench/src/cli.ts';
