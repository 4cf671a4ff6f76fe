#!/usr/bin/env bash
# Session 28 call 5: the issue's throughput acceptance on the tree's addon (s6 = 074c3d8's kernels):
# nano-vllm's workload (256 requests, lengths 100-1024) on the 0.6B against the batched PyTorch
# baseline in the same call, the run.sh defaults (three NERVA variants, 8 requests verified alone).
mkdir -p /tmp/nerva-addon && xz -dc .device/s6/nerva_cuda.node.xz > /tmp/nerva-addon/nerva_cuda.node
NERVA_SIZES=qwen3-0.6b bash tools/gpu/run.sh synth,throughput 2>&1 | grep "run.sh\]"
python3 - "$OUT/throughput.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    print({k: j.get(k) for k in ('probe', 'variant', 'run_env', 'output_tok_s', 'speedup_vs_torch', 'verified', 'verify_equal', 'tokens_equal_alone', 'error') if k in j})
PY
