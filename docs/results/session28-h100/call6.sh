#!/usr/bin/env bash
# Session 28 call 6: the issue's other acceptance probes on the tree's addon (s6 = 074c3d8's
# kernels): the throughput workload batch-invariant (bf16 KV and matmuls: every verified request
# equal alone) against the PyTorch baseline in the same call, 32 forks of the 0.6B (bf16 KV,
# batch-invariant, as session 15), prefill of 4096 tokens on the 8B.
mkdir -p /tmp/nerva-addon && xz -dc .device/s6/nerva_cuda.node.xz > /tmp/nerva-addon/nerva_cuda.node
O=$OUT
mkdir -p $O/tf $O/pf
NERVA_SIZES=qwen3-0.6b NERVA_THROUGHPUT_VARIANTS="--batch-invariant --kv-cache-dtype bf16 --matmul-precision bf16" \
  NERVA_FORK_KV=bf16 NERVA_FORK_ARGS=--batch-invariant OUT=$O/tf bash tools/gpu/run.sh synth,throughput,fork 2>&1 | grep "run.sh\]"
OUT=$O/pf bash tools/gpu/run.sh prefill 2>&1 | grep "run.sh\]"
python3 - $O/tf/throughput.jsonl $O/tf/fork.jsonl $O/pf/prefill.jsonl <<'PY'
import json, sys
keys = ('probe', 'kv_dtype', 'matmul_precision', 'batch_invariant', 'output_tok_s', 'speedup_vs_torch', 'verified', 'mismatches',
        'decode_speedup', 'tokens_identical', 'prompt_len', 'tokens_per_s', 'mfu', 'error')
for f in sys.argv[1:]:
    for l in open(f):
        j = json.loads(l)
        print({k: j[k] for k in keys if k in j})
PY
