#!/usr/bin/env bash
# Session 28 call 7: conformance with three new op decoder_layers cases that carry maxKeys (one
# row, headDim 128: the cluster attention on sm_90; 9, 200 and 1000 keys), on the tree's kernels
# (s6), on them with clusters of 16 (NERVA_ATTN_SHORT=16), and on session 27's kernels (t1).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" s6=.device/s6 t1=.device/t1
for v in "s6" "s6 NERVA_ATTN_SHORT=16" "t1"; do
  set -- $v
  name=$1; shift
  echo "== $name $*"
  env NERVA_CUDA_ADDON=/tmp/$name.node "$@" OUT=$AB timeout 200 $AB_NODE .device/dist8/conformance.mjs > $AB/conf-$name-$#.log 2>&1
  echo "rc $?"; grep -i "maxKeys" $AB/conf-$name-$#.log | head -6; tail -4 $AB/conf-$name-$#.log
done
ab_pack call7
