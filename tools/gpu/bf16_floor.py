#!/usr/bin/env python3
"""GPU machine only, transformers as the subject (never part of the product): how far apart two
bf16 runs of the same checkpoint land when they are not bit-identical. Builds each config with
transformers' from_config on the GPU, initialized as `nerva synth` does (matrices N(0, 0.02), norm
weights N(1, 0.02), values rounded to bf16), runs a 64-token prompt and 8 teacher-forced steps with
eager attention, and reports (max over steps of max|diff| / max|logit|):
  bf16_vs_f32            transformers bf16 against the same weights in float32
  nudged_vs_bf16         bf16 with 1 in 10,000 of layer 0's outputs moved by one bf16 ulp
  cpu_vs_gpu             bf16 on the CPU against bf16 on the GPU (--cpu; slow on big shapes)
  residual_scaled_*      the same two figures with o_proj/down_proj at std 0.02/sqrt(2L)
and, once, the share of elements where cuBLAS's bf16 linear differs from the float64 product
rounded to bf16.
usage: bf16_floor.py OUT_JSON CONFIG.json [CONFIG.json ...] [--cpu]"""
import copy, gc, json, math, sys
import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from hf_probe import nudge_layer0, rel_per_step

args = [a for a in sys.argv[1:] if not a.startswith("--")]
with_cpu = "--cpu" in sys.argv
out_json, configs = args[0], args[1:]


def rel(a, b):
    return max(rel_per_step(a, b))


def logits(model, prompt, forced, device="cuda", nudge=0.0):
    hooks = [nudge_layer0(model, nudge)] if nudge > 0 else []
    rows = []
    with torch.no_grad():
        out = model(torch.tensor([prompt], device=device), use_cache=True)
        for t in forced:
            rows.append(out.logits[0, -1].float().cpu().numpy())
            out = model(torch.tensor([[t]], device=device), past_key_values=out.past_key_values, use_cache=True)
    for h in hooks:
        h.remove()
    return np.stack(rows)


def gemm_mismatch():
    torch.manual_seed(0)
    res = {}
    for m in (1, 64):
        for k, n in ((1024, 4096), (3072, 1024), (4096, 12288)):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
            y = torch.nn.functional.linear(x, w)
            ref = (x.double() @ w.double().T).float().to(torch.bfloat16)
            res[f"M{m}_K{k}_N{n}"] = float((y != ref).float().mean())
    return res


result = {"cublas_bf16_linear_mismatch_vs_f64_rounded": gemm_mismatch(), "shapes": {}}
for path in configs:
    cfg = AutoConfig.from_pretrained(path)
    layers = cfg.num_hidden_layers
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, cfg.vocab_size, 64).tolist()
    forced = rng.integers(0, cfg.vocab_size, 8).tolist()
    shape = {}
    for init in ("plain", "residual_scaled"):
        torch.manual_seed(0)
        with torch.device("cuda"):
            m32 = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            for name, p in m32.named_parameters():
                if name.endswith("norm.weight"):
                    p.normal_(1.0, 0.02)
                else:
                    scaled = init == "residual_scaled" and (name.endswith("o_proj.weight") or name.endswith("down_proj.weight"))
                    p.normal_(0.0, 0.02 / math.sqrt(2 * layers) if scaled else 0.02)
                p.copy_(p.to(torch.bfloat16).float())
        f32 = logits(m32, prompt, forced)
        m16 = copy.deepcopy(m32).to(torch.bfloat16)
        del m32
        gc.collect()
        torch.cuda.empty_cache()
        b16 = logits(m16, prompt, forced)
        pre = "" if init == "plain" else "residual_scaled_"
        shape[pre + "bf16_vs_f32"] = rel(b16, f32)
        shape[pre + "nudged_vs_bf16"] = rel(logits(m16, prompt, forced, nudge=1e-4), b16)
        if with_cpu and init == "plain":
            torch.set_num_threads(16)
            mc = m16.to("cpu")
            shape["cpu_vs_gpu"] = rel(logits(mc, prompt, forced, device="cpu"), b16)
            del mc
        del m16
        gc.collect()
        torch.cuda.empty_cache()
    result["shapes"][path] = shape
    print(f"bf16 floor {path}: " + ", ".join(f"{k} {v:.3e}" for k, v in shape.items()), flush=True)
json.dump(result, open(out_json, "w"), indent=1)
print("cuBLAS bf16 linear vs f64 rounded, share of elements that differ:", result["cublas_bf16_linear_mismatch_vs_f64_rounded"])
