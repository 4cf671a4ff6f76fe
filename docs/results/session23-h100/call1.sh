# Session 23, call 1: k_attn_decode_short (clusters, keys in shared memory, no global merge)
# against the split-KV kernel, one addon (NERVA_ATTN_SHORT unset = the split kernel).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for i in 1 2; do
  ab_run base new
  ab_run s8c64 new NERVA_ATTN_SHORT=8 NERVA_ATTN_SHORT_CAP=64
  ab_run s4c96 new NERVA_ATTN_SHORT=4 NERVA_ATTN_SHORT_CAP=96
  ab_run s16c32 new NERVA_ATTN_SHORT=16 NERVA_ATTN_SHORT_CAP=32
  ab_run s2c192 new NERVA_ATTN_SHORT=2 NERVA_ATTN_SHORT_CAP=192
done
PL=1536 GEN=128 ab_run base-1536 new
PL=1536 GEN=128 ab_run s8c64-1536 new NERVA_ATTN_SHORT=8 NERVA_ATTN_SHORT_CAP=64
ab_run bf16-base new NERVA_KV_DTYPE=bf16
ab_run bf16-s8c64 new NERVA_KV_DTYPE=bf16 NERVA_ATTN_SHORT=8 NERVA_ATTN_SHORT_CAP=64
ab_report
NERVA_ATTN_SHORT=8 NERVA_ATTN_SHORT_CAP=64 ab_check new
grep -i "fail" $AB/conf.log | head -20
ab_pack call1
