#!/usr/bin/env python3
"""Oracle for the GPU machine only (never part of the product): transformers in bf16 on the same
synthetic checkpoint, the same prompt, then the same teacher-forced tokens decoded one step at a
time with a KV cache. Compares every step's logits with NERVA's (nerva-forced.f32).
usage: oracle_parity.py MODEL_DIR OUT_JSON"""
import json, sys, time
import numpy as np
import torch
from transformers import AutoModelForCausalLM

model_dir, out_json = sys.argv[1], sys.argv[2]
meta = json.load(open(f"{model_dir}/nerva-forced.json"))
ours = np.fromfile(f"{model_dir}/nerva-forced.f32", dtype=np.float32).reshape(meta["steps"], meta["vocab"])
t0 = time.time()
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
load_s = time.time() - t0
ids = torch.tensor([meta["prompt"]], device="cuda")
rels = []
with torch.no_grad():
    out = model(ids, use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1].float().cpu().numpy()
    for step in range(meta["steps"]):
        ref = logits
        rels.append(float(np.abs(ours[step] - ref).max() / np.abs(ref).max()))
        tok = torch.tensor([[meta["forced"][step]]], device="cuda")
        out = model(tok, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float().cpu().numpy()
res = {"model": model_dir, "steps": meta["steps"], "max_rel_err": max(rels), "rel_err_per_step": rels,
       "tolerance": 2e-2, "pass": max(rels) <= 2e-2, "hf_load_s": load_s}
json.dump(res, open(out_json, "w"), indent=1)
print(f"oracle {model_dir}: max rel err {max(rels):.3e} over {meta['steps']} steps -> {'ok' if res['pass'] else 'FAIL'}")
sys.exit(0 if res["pass"] else 1)
