#!/usr/bin/env bash
# Session 23 call 6: where k_attn_decode_short's warps stall (Nsight Compute, kernel replay: the
# kernel alone, no PDL overlap), if the machine has ncu.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
NCU=$(ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu /usr/bin/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw --format=csv
if [ -n "$NCU" ]; then
  for k in k_attn_decode_short k_attn_partial_rope; do
    s=8; [ $k = k_attn_partial_rope ] && s=0
    OUT=$AB/x NERVA_CUDA_ADDON=/tmp/new.node NERVA_ATTN_SHORT=$s timeout 300 $NCU -k regex:$k --launch-skip 300 --launch-count 2 \
      --section WarpStateStats --section SchedulerStats --section LaunchStats --section SpeedOfLight --section SourceCounters \
      $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 32 > $AB/ncu-$k.txt 2>&1
    echo "== $k rc $?"
    grep -E "Duration|SM Frequency|Elapsed Cycles|Stall|Warp Cycles Per|Issued Warp|No Eligible|Active Warps Per|Registers|Shared Memory Config|Dynamic Shared|Block Limit|est\. Speedup|stall" $AB/ncu-$k.txt | head -60
  done
  OUT=$AB/x NERVA_CUDA_ADDON=/tmp/new.node NERVA_ATTN_SHORT=8 timeout 300 $NCU -k regex:k_attn_decode_short --launch-skip 300 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source cuda --csv \
    $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 32 > $AB/ncu-source.csv 2>&1
  echo "source rc $? $(wc -l < $AB/ncu-source.csv) lines"
  head -3 $AB/ncu-source.csv | cut -c1-600
fi
ab_pack call6
