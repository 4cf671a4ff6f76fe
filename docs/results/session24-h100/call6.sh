#!/usr/bin/env bash
# Session 24 call 6: the SASS of the bounded and unbounded qkv kernels (call 5's build): are all
# four weight loads of a lane still issued before the dependency wait (ACQBULK) at 48 registers?
xz -dc .device/addon/nerva_cuda.node.xz > /tmp/n.node; C=$(ls -d /usr/local/cuda*/bin 2>/dev/null | head -1); echo $C; ls $C | grep -i -E "cuobjdump|nvdisasm"; $C/cuobjdump -sass /tmp/n.node 2>&1 | awk '/Function : .*k_gemv_bf16_leanILi1ELi1ELb1ELb0ELi1E/{p=1} /Function : /{if(!($0 ~ /k_gemv_bf16_leanILi1ELi1ELb1ELb0ELi1E/))p=0} p' > $OUT/lean.sass; $C/cuobjdump -sass /tmp/n.node 2>&1 | awk '/Function : .*k_gemv_bf16ILi1ELi1ELb1ELb0ELi1E/{p=1} /Function : /{if(!($0 ~ /k_gemv_bf16ILi1ELi1ELb1ELb0ELi1E/))p=0} p' > $OUT/plain.sass; wc -l $OUT/*.sass
