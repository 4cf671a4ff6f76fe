#!/usr/bin/env python3
"""Sliding-window fixture maker (needs torch + transformers 5.x; never part of the product).

Builds a tiny random Qwen2ForCausalLM (or Qwen3ForCausalLM with --arch qwen3) with sliding-window
attention in some layers, saves it as float32 safetensors with a hub-layout config.json, and writes
reference.json + reference.safetensors beside it in the format of ../shared/fixtures (see its
README): for each prompt, greedy tokens with the weights in float64, eager attention and the KV
cache, on CPU (`greedy_f64`; transformers' RMSNorm still computes in float32), each step's top-2 logit margin, the top-5 ids and logits and the
full float64 logits of the last prompt position (stored F32 as `logits_last_<i>`). With a CUDA
device, also the greedy tokens in bf16 on it (`greedy_bf16_gpu`, `bf16_agrees_for`).

Prompts are longer than the window, so the window shapes the answer; the script checks that it
does (the same weights with use_sliding_window=false give other logits) and that transformers'
KV-cache decode agrees with a full recompute of every step. The engine needs no tokenizer: cases
carry prompt ids only.

usage: make_swa_fixture.py OUT_DIR [--arch qwen2|qwen3] [--window 6] [--layers 3]
                          [--max-window-layers 1] [--layer-types] [--seed 0] [--new-tokens 16]
  --layer-types writes `layer_types` into config.json (transformers then ignores
  max_window_layers); without it the sliding layers follow from max_window_layers.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--arch", choices=["qwen2", "qwen3"], default="qwen2")
p.add_argument("--window", type=int, default=6)
p.add_argument("--layers", type=int, default=3)
p.add_argument("--max-window-layers", type=int, default=1)
p.add_argument("--layer-types", action="store_true")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--new-tokens", type=int, default=16)
a = p.parse_args()

major = int(transformers.__version__.split(".")[0])
if major < 5:
    sys.exit(f"transformers {transformers.__version__}: the fixture's semantics are those of transformers 5.x")

os.makedirs(a.out, exist_ok=True)
torch.manual_seed(a.seed)
VOCAB = 256
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
layer_types = ["sliding_attention" if i >= a.max_window_layers else "full_attention" for i in range(a.layers)]
if "sliding_attention" not in layer_types:
    sys.exit("no layer slides: lower --max-window-layers")

# config.json in the hub's own layout (rope_theta, torch_dtype), as users' checkpoints carry it.
config = {
    "architectures": ["Qwen2ForCausalLM" if a.arch == "qwen2" else "Qwen3ForCausalLM"],
    "model_type": a.arch,
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": a.layers,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "use_sliding_window": True,
    "sliding_window": a.window,
    "max_window_layers": a.max_window_layers,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "initializer_range": 0.1,
    "torch_dtype": "float32",
}
if a.arch == "qwen3":
    config["head_dim"] = HEAD_DIM
    config["attention_bias"] = False
if a.layer_types:
    config["layer_types"] = layer_types
with open(os.path.join(a.out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")

# Random weights; norms perturbed away from 1.0 so a skipped norm is caught.
model = AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(a.out), dtype=torch.float32)
with torch.no_grad():
    for name, t in model.named_parameters():
        if name.endswith("norm.weight"):
            t.copy_(1.0 + 0.25 * torch.randn_like(t))
        elif name.endswith(".bias"):
            t.copy_(0.05 * torch.randn_like(t))
state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
save_file(state, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
del model


def load(dtype, device="cpu", **overrides):
    m = AutoModelForCausalLM.from_pretrained(a.out, dtype=dtype, attn_implementation="eager", **overrides)
    return m.to(device).eval()


# Everything below is computed from the files on disk.
ref = load(torch.float64)
got_types = list(ref.config.layer_types)
if got_types != layer_types or ref.config.sliding_window != a.window:
    sys.exit(f"transformers reads layer_types {got_types}, sliding_window {ref.config.sliding_window}; expected {layer_types}, {a.window}")
full = load(torch.float64, use_sliding_window=False, layer_types=["full_attention"] * a.layers)
if "sliding_attention" in list(full.config.layer_types):
    sys.exit("use_sliding_window=False still slides")

g = torch.Generator().manual_seed(a.seed + 1)
lengths = [1, a.window - 1, 20, 37]
prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def greedy(model, ids, steps, device="cpu"):
    """Greedy decode with the KV cache: tokens, and the logits before each (float64 on the host)."""
    out = model(torch.tensor([ids], device=device), use_cache=True)
    toks, logits = [], []
    for _ in range(steps):
        lg = out.logits[0, -1].to(torch.float64).cpu()
        logits.append(lg)
        t = int(torch.argmax(lg))
        toks.append(t)
        out = model(torch.tensor([[t]], device=device), past_key_values=out.past_key_values, use_cache=True)
    return toks, logits


@torch.no_grad()
def last_logits(model, ids):
    return model(torch.tensor([ids]), use_cache=False).logits[0, -1].to(torch.float64)


cases = []
tensors = {}
checks = {"cache_vs_recompute_max_abs": 0.0, "max_abs_logit": 0.0, "window_changes_logits": []}
for i, ids in enumerate(prompts):
    toks, logits = greedy(ref, ids, a.new_tokens)
    # transformers' sliding KV cache against recomputing the whole sequence at every step.
    seq = list(ids)
    for s, lg in enumerate(logits):
        checks["max_abs_logit"] = max(checks["max_abs_logit"], float(lg.abs().max()))
        checks["cache_vs_recompute_max_abs"] = max(checks["cache_vs_recompute_max_abs"], float((last_logits(ref, seq) - lg).abs().max()))
        seq.append(toks[s])
    # The window is applied: beyond it the full-attention model disagrees, within it agrees.
    diff = float((last_logits(full, ids) - logits[0]).abs().max())
    checks["window_changes_logits"].append({"prompt_len": len(ids), "max_abs_diff_vs_full_attention": diff})
    if len(ids) <= a.window and diff > 1e-6:
        sys.exit(f"prompt of {len(ids)} <= window {a.window} differs from full attention by {diff}")
    if len(ids) > a.window + 2 and diff < 1e-6:
        sys.exit(f"prompt of {len(ids)} > window {a.window} equals full attention: the window is not applied")
    margins = []
    for lg in logits:
        top2 = torch.topk(lg, 2).values
        margins.append(float(f"{float(top2[0] - top2[1]):.3g}"))
    top5 = torch.topk(logits[0], 5)
    name = f"logits_last_{i}"
    tensors[name] = logits[0].to(torch.float32).contiguous()
    cases.append(
        {
            "prompt": None,
            "prompt_ids": ids,
            "greedy_f64": toks,
            "reference_dtype": "float64",
            "step_top2_margin": margins,
            "top5_ids_f64": top5.indices.tolist(),
            "top5_logits_f64": [round(float(x), 6) for x in top5.values],
            "logits_tensor": name,
        }
    )
# Not bit for bit: transformers' RMSNorm computes in float32 even in a float64 model, and its
# float32 reductions differ between a prefill's shapes and a decode step's (~1e-7 relative). A
# window applied off by one position would differ by far more.
if checks["cache_vs_recompute_max_abs"] > 1e-5 * checks["max_abs_logit"]:
    sys.exit(f"transformers' KV-cache decode differs from recomputing by {checks['cache_vs_recompute_max_abs']}")

how = (
    "greedy_f64: weights upcast to float64, eager attention, KV cache, on CPU. logits_last_i (in the "
    ".safetensors beside this file): float64 logits of the last prompt position, stored as F32."
)
if torch.cuda.is_available():
    bf = load(torch.bfloat16, "cuda")
    for c in cases:
        t, _ = greedy(bf, c["prompt_ids"], a.new_tokens, "cuda")
        c["greedy_bf16_gpu"] = t
        c["bf16_agrees_for"] = next((k for k, (x, y) in enumerate(zip(t, c["greedy_f64"])) if x != y), len(t))
    how += f" greedy_bf16_gpu: bf16 weights and compute, eager attention, on {torch.cuda.get_device_name(0)}."

save_file(tensors, os.path.join(a.out, "reference.safetensors"))
with open(os.path.join(a.out, "reference.json"), "w") as f:
    json.dump(
        {
            "made_by": f"transformers {transformers.__version__}, torch {torch.__version__}",
            "how": how,
            "new_tokens": a.new_tokens,
            "sliding": {"sliding_window": a.window, "layer_types": layer_types, "config_has_layer_types": a.layer_types},
            "checks": checks,
            "cases": cases,
        },
        f,
        indent=1,
    )
    f.write("\n")
print(json.dumps({"out": a.out, "layer_types": layer_types, "checks": checks}))
