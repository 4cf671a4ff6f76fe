#!/usr/bin/env python3
"""Baseline for the GPU machine only (never part of the product): Hugging Face accelerate offload
on the checkpoint `nerva-bench offload` runs, under the same VRAM budget, so the two speeds are
measured side by side in one device call.

transformers loads the checkpoint (bf16) with device_map='auto' and max_memory={0: BUDGET,
'cpu': CPU_MEMORY}: accelerate keeps what fits in the budget on GPU 0 and offloads the rest to
CPU memory (and to disk past CPU_MEMORY), copying offloaded weights to the GPU module by module on
every forward. After a warm-up, it times a greedy generate of 1 token and of N tokens from the
same prompt of M ids `nerva-bench offload` uses (its xorshift syntheticPrompt, seed 1); decode
tok/s = (N - 1) / (time(N) - time(1)), so loading and the prompt's pass are left out as in
NERVA's ledger. Writes one JSON line to stdout and to --out.

usage: accelerate_offload.py MODEL_DIR [--budget 4GiB] [--new-tokens 8] [--prompt-len 16]
                             [--cpu-memory 120GiB] [--offload-folder DIR] [--out FILE]
Sizes: KiB/MiB/GiB/TiB = powers of 1024, KB/MB/GB/TB = powers of 1000, a bare K/M/G/T = KiB..TiB
(as nerva's --vram-budget). A missing torch/transformers/accelerate is reported in the JSON
("error"), with tok_s null and exit status 2."""
import argparse
import importlib
import json
import os
import re
import sys
import time

UNITS = {"": 1, "b": 1, "k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 10**6,
         "g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 10**12}


def parse_size(text, option):
    """The grammar of nerva's size flags (packages/server/src/size.ts); whole bytes, > 0."""
    if text.strip().startswith("-"):
        raise SystemExit(f"{option} must be greater than zero, got {text!r}")
    m = re.fullmatch(r"(\d+(?:\.\d+)?|\.\d+)\s?([A-Za-z]*)", text.strip())
    unit = m.group(2).lower() if m else None
    if not m or unit not in UNITS or (UNITS[unit] == 1 and "." in m.group(1)):
        raise SystemExit(f"{option} must be a size such as 4GiB, 4096MiB, 512MB, 4G (= 4GiB) or a byte count, got {text!r}")
    n = int(float(m.group(1)) * UNITS[unit])
    if n <= 0:
        raise SystemExit(f"{option} must be greater than zero, got {text!r}")
    return n


def synthetic_prompt(length, vocab, seed=1):
    """nerva-bench's syntheticPrompt (packages/bench/src/measure.ts): xorshift32, ids mod vocab."""
    x = (seed & 0xFFFFFFFF) or 1
    out = []
    for _ in range(length):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out.append(x % vocab)
    return out


def version_of(name):
    try:
        return importlib.import_module(name).__version__
    except Exception:
        return None


def device_summary(model):
    """Modules and parameter bytes per place in the device map accelerate chose."""
    dmap = getattr(model, "hf_device_map", None) or {}
    where = {}
    for name, dev in dmap.items():
        kind = "disk" if dev == "disk" else "cpu" if dev == "cpu" else "gpu"
        where[name] = kind
    out = {"gpu_modules": 0, "cpu_modules": 0, "disk_modules": 0, "gpu_bytes": 0, "cpu_bytes": 0, "disk_bytes": 0}
    for kind in where.values():
        out[f"{kind}_modules"] += 1
    # Offloaded parameters sit on the meta device; the map says where they really live.
    keys = sorted(where, key=len, reverse=True)
    for pname, p in model.named_parameters():
        owner = next((k for k in keys if k == "" or pname == k or pname.startswith(k + ".")), None)
        if owner is not None:
            out[f"{where[owner]}_bytes"] += p.numel() * p.element_size()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--budget", default="4GiB", help="GPU 0's max_memory (default 4GiB)")
    ap.add_argument("--cpu-memory", default="120GiB", help="CPU max_memory; beyond it accelerate offloads to disk")
    ap.add_argument("--offload-folder", default=None, help="disk offload folder (default: a folder next to --out)")
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--out", default=None, help="also write the JSON line here")
    a = ap.parse_args()
    budget = parse_size(a.budget, "--budget")
    cpu_memory = parse_size(a.cpu_memory, "--cpu-memory")
    if a.new_tokens < 2 or a.prompt_len < 1:
        raise SystemExit("--new-tokens must be at least 2 and --prompt-len at least 1")

    res = {
        "probe": "accelerate_offload",
        "model": a.model,
        "budget_bytes": budget,
        "budget": a.budget,
        "cpu_memory_bytes": cpu_memory,
        "prompt_len": a.prompt_len,
        "new_tokens": a.new_tokens,
        "tok_s": None,
        "versions": {"python": sys.version.split()[0], "torch": version_of("torch"), "transformers": version_of("transformers"), "accelerate": version_of("accelerate")},
    }

    def finish(status):
        line = json.dumps(res)
        print(line, flush=True)
        if a.out:
            with open(a.out, "w") as f:
                f.write(line + "\n")
        sys.exit(status)

    missing = [k for k, v in res["versions"].items() if v is None]
    if missing:
        res["error"] = f"not installed: {', '.join(missing)} (device_map='auto' with max_memory needs torch, transformers and accelerate)"
        finish(2)

    import torch
    from transformers import AutoModelForCausalLM

    if not torch.cuda.is_available():
        res["error"] = "no CUDA device: the baseline offloads from CPU memory to GPU 0"
        finish(2)
    res["device"] = torch.cuda.get_device_name(0)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    prompt = synthetic_prompt(a.prompt_len, cfg["vocab_size"])
    res["prompt_ids"] = prompt
    offload = a.offload_folder or os.path.join(os.path.dirname(os.path.abspath(a.out or ".")), "accelerate-offload")

    t0 = time.time()
    # transformers >= 4.56 names the dtype argument `dtype` (`torch_dtype` is its deprecated alias).
    major, minor = (int(x) for x in re.findall(r"\d+", res["versions"]["transformers"])[:2])
    dtype_kw = {"dtype": torch.bfloat16} if (major, minor) >= (4, 56) else {"torch_dtype": torch.bfloat16}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            a.model, device_map="auto", max_memory={0: budget, "cpu": cpu_memory}, offload_folder=offload, **dtype_kw
        ).eval()
    except Exception as e:  # a budget accelerate cannot plan with, a broken folder: say so in the JSON
        res["error"] = f"from_pretrained failed: {type(e).__name__}: {e}"
        finish(1)
    res["load_s"] = round(time.time() - t0, 2)
    res["device_map"] = device_summary(model)
    ids = torch.tensor([prompt], device="cuda:0")

    def generate(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids))
        torch.cuda.synchronize()
        return time.perf_counter() - t, out[0, ids.shape[1]:].tolist()

    torch.cuda.reset_peak_memory_stats(0)
    generate(2)  # warm-up: kernels, allocator, accelerate's hooks
    t1, _ = generate(1)
    tn, tokens = generate(a.new_tokens)
    res["one_token_s"] = round(t1, 4)
    res["n_tokens_s"] = round(tn, 4)
    res["tok_s"] = round((a.new_tokens - 1) / (tn - t1), 4) if tn > t1 else None
    res["tok_s_with_prefill"] = round(a.new_tokens / tn, 4)
    res["ms_per_token"] = round(1000 * (tn - t1) / (a.new_tokens - 1), 2) if tn > t1 else None
    res["peak_vram_bytes"] = torch.cuda.max_memory_allocated(0)
    res["token_ids"] = tokens
    finish(0)


if __name__ == "__main__":
    main()
