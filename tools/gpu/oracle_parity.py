#!/usr/bin/env python3
"""Oracle for the GPU machine only (never part of the product): transformers on the same synthetic
checkpoint, the same prompt, then the same teacher-forced tokens decoded one step at a time with a
KV cache, in bf16 (the acceptance reference) and in float32 (the same bf16 weights upcast: the
exact answer, to tell bf16's own error from ours). Compares every step's logits with NERVA's, in
both of NERVA's numerics: 'bf16' (rounding where transformers' bf16 eager forward rounds; the
acceptance figure) and 'exact' (float32 activations; compared with transformers f32).
usage: oracle_parity.py MODEL_DIR OUT_JSON"""
import gc, json, sys, time
import numpy as np
import torch
from transformers import AutoModelForCausalLM
from hf_probe import nudge_layer0, rel_per_step

model_dir, out_json = sys.argv[1], sys.argv[2]
meta = json.load(open(f"{model_dir}/nerva-forced.json"))
ours = np.fromfile(f"{model_dir}/nerva-forced.f32", dtype=np.float32).reshape(meta["steps"], meta["vocab"])
# NERVA with numerics 'bf16' (activations rounded where transformers' bf16 eager forward rounds them).
ours_b16 = np.fromfile(f"{model_dir}/nerva-forced-bf16.f32", dtype=np.float32).reshape(meta["steps"], meta["vocab"])


def run(dtype, attn="eager", flip=0.0):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn).cuda().eval()
    if flip > 0:
        nudge_layer0(model, flip)
    out_logits = []
    with torch.no_grad():
        out = model(torch.tensor([meta["prompt"]], device="cuda"), use_cache=True)
        for step in range(meta["steps"]):
            out_logits.append(out.logits[0, -1].float().cpu().numpy())
            tok = torch.tensor([[meta["forced"][step]]], device="cuda")
            out = model(tok, past_key_values=out.past_key_values, use_cache=True)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return np.stack(out_logits)


rel = rel_per_step


t0 = time.time()
hf_bf16 = run(torch.bfloat16)
hf_f32 = run(torch.float32)
# How far two valid bf16 runs of transformers itself are apart (only the attention kernel differs):
# the noise floor any independent bf16 implementation faces on this checkpoint.
hf_bf16_sdpa = run(torch.bfloat16, "sdpa")
# transformers bf16 against itself with 1 in 10,000 of layer 0's outputs one ulp off: once any value
# differs upstream, every rounding downstream is drawn anew, so this is the floor for any bf16
# implementation that is not bit-identical to this run.
hf_bf16_nudged = run(torch.bfloat16, flip=1e-4)
ours_bf16 = rel(ours, hf_bf16)
b16_bf16 = rel(ours_b16, hf_bf16)
res = {
    "model": model_dir,
    "steps": meta["steps"],
    "tolerance": 2e-2,
    # The acceptance figure: NERVA in bf16 numerics against transformers bf16 (eager).
    "bf16_numerics_max_rel_err_vs_hf_bf16": max(b16_bf16),
    "bf16_numerics_max_rel_err_vs_hf_bf16_sdpa": max(rel(ours_b16, hf_bf16_sdpa)),
    "bf16_numerics_max_rel_err_vs_hf_f32": max(rel(ours_b16, hf_f32)),
    "bf16_numerics_rel_err_vs_hf_bf16_per_step": b16_bf16,
    # NERVA's default, exact numerics.
    "max_rel_err_vs_hf_bf16": max(ours_bf16),
    "max_rel_err_vs_hf_f32": max(rel(ours, hf_f32)),
    "hf_bf16_max_rel_err_vs_hf_f32": max(rel(hf_bf16, hf_f32)),
    "hf_bf16_sdpa_max_rel_err_vs_hf_bf16_eager": max(rel(hf_bf16_sdpa, hf_bf16)),
    "hf_bf16_one_ulp_in_1e-4_of_layer0_vs_hf_bf16": max(rel(hf_bf16_nudged, hf_bf16)),
    "rel_err_vs_hf_bf16_per_step": ours_bf16,
    "pass": max(b16_bf16) <= 2e-2,
    "oracle_s": time.time() - t0,
}
json.dump(res, open(out_json, "w"), indent=1)
print(f"oracle {model_dir}: bf16 numerics vs HF bf16 {res['bf16_numerics_max_rel_err_vs_hf_bf16']:.3e} (vs sdpa {res['bf16_numerics_max_rel_err_vs_hf_bf16_sdpa']:.3e}); "
      f"exact numerics vs HF bf16 {res['max_rel_err_vs_hf_bf16']:.3e}, vs HF f32 {res['max_rel_err_vs_hf_f32']:.3e}, "
      f"HF bf16 vs f32 {res['hf_bf16_max_rel_err_vs_hf_f32']:.3e}, HF bf16 sdpa vs eager {res['hf_bf16_sdpa_max_rel_err_vs_hf_bf16_eager']:.3e}, "
      f"HF bf16 with 1 ulp on 1e-4 of layer 0 vs HF bf16 {res['hf_bf16_one_ulp_in_1e-4_of_layer0_vs_hf_bf16']:.3e} -> {'ok' if res['pass'] else 'FAIL'}")
sys.exit(0 if res["pass"] else 1)
