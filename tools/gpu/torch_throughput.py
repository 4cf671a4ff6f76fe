#!/usr/bin/env python3
"""Baseline for the GPU machine only (never part of the product): a batched PyTorch server loop on
the checkpoint and the workload `nerva-bench throughput` runs (nano-vllm's bench.py: 256 requests,
random prompt and output lengths, greedy, ignore_eos), so the two output tok/s are measured side
by side in one device call.

What it is (a hand-written engine in plain torch, the strongest recipe that needs no library
beyond torch):
- the Qwen3 / Qwen2 / Llama forward written out (RMSNorm, q/k norm, RoPE incl. llama3 scaling,
  GQA, SwiGLU, tied or untied head) with fused QKV and gate/up weights, in bf16;
- a static padded KV cache [layers, slots, kv heads, T, head dim] (T = the longest request,
  rounded up to --kv-bucket), continuous batching over the slots: a slot that finishes is
  refilled from the queue at once; prefill in padded batches (lengths sorted, causal SDPA/flash);
- decode steps as CUDA graphs, one per (batch, KV length bucket): attention reads only the
  bucket covering the longest live sequence, and once the queue is empty the live slots are
  compacted into a smaller captured batch (8 graphs per halving), so finished slots stop costing;
- the element-wise chains (RMSNorm, q/k norm + RoPE, SiLU*up, residual add) through
  torch.compile (fullgraph, dynamic shapes) when it compiles and matches eager, else eager;
- decode attention: F.scaled_dot_product_attention with the query heads of a KV head grouped
  (no KV repeat) or the same in matmuls; the faster of {sdpa, math} x {compiled, eager} at the
  largest captured shape is chosen by timing, and the timings are reported.
Greedy tokens, no host sync per step (request lengths are known: max_tokens with ignore_eos);
tokens are read back once at the end.

Output: one JSON line (stdout and --out): output_tok_s, total_s, output_tokens, mode, batch_size,
versions, workload_sha256 (sha256 of the workload's canonical JSON: json.dumps with separators
(',', ':') of {seed, min_len, max_input_len, max_output_len, token_id_limit, requests:
[{prompt_ids, max_tokens}]} in that key order; `nerva-bench throughput --workload-out` writes
exactly those bytes). A failure is an "error" field in the line (exit status 1).

usage: torch_throughput.py --model DIR --workload FILE [--out FILE] [--batch-size N|auto]
         [--dtype bf16|f16|f32] [--device cuda|cpu] [--compile auto|on|off] [--graphs auto|on|off]
         [--attention auto|sdpa|math] [--kv-bucket 256] [--max-prefill-tokens 16384]
         [--check-tokens N] [--tokens-out FILE]
       torch_throughput.py --workload FILE --print-sha      (no torch needed)"""
import argparse
import hashlib
import json
import math
import os
import struct
import sys
import time
import traceback
from collections import deque

WORKLOAD_KEYS = ("seed", "min_len", "max_input_len", "max_output_len", "token_id_limit")


# ---------------------------------------------------------------- workload (no torch needed)
def canonical_workload_json(w):
    """The canonical text of a workload, the same as canonicalWorkloadJson in packages/bench/src/workload.ts."""
    obj = {k: w[k] for k in WORKLOAD_KEYS}
    obj["requests"] = [{"prompt_ids": r["prompt_ids"], "max_tokens": r["max_tokens"]} for r in w["requests"]]
    return json.dumps(obj, separators=(",", ":"))


def workload_sha256(w):
    return hashlib.sha256(canonical_workload_json(w).encode("utf-8")).hexdigest()


def load_workload(path):
    """Reads and checks a workload file; errors name the file and the field."""
    with open(path, "rb") as f:
        w = json.loads(f.read().decode("utf-8"))
    if not isinstance(w, dict) or not isinstance(w.get("requests"), list) or not w["requests"]:
        raise ValueError(f"workload {path}: no non-empty 'requests' array")
    for k in WORKLOAD_KEYS:
        if not isinstance(w.get(k), int) or isinstance(w.get(k), bool):
            raise ValueError(f"workload {path}: '{k}' must be an integer")
    for i, r in enumerate(w["requests"]):
        ids = r.get("prompt_ids") if isinstance(r, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and 0 <= t < w["token_id_limit"] for t in ids):
            raise ValueError(f"workload {path}: requests[{i}].prompt_ids must be a non-empty list of ids in [0, {w['token_id_limit']})")
        if not isinstance(r.get("max_tokens"), int) or r["max_tokens"] < 1:
            raise ValueError(f"workload {path}: requests[{i}].max_tokens must be a positive integer")
    return w


# ---------------------------------------------------------------- checkpoint (safetensors, read directly)
ST_DTYPES = {"BF16": ("int16", "bfloat16"), "F16": ("float16", "float16"), "F32": ("float32", "float32")}


def safetensors_entries(model_dir):
    """name -> (file, dtype, shape, begin, end) over model.safetensors or the shards an index names."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        path = os.path.join(model_dir, fn)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for name, e in header.items():
            if name == "__metadata__":
                continue
            if e["dtype"] not in ST_DTYPES:
                raise ValueError(f"{path}: tensor {name} has dtype {e['dtype']}; this baseline reads BF16, F16 and F32")
            b, en = e["data_offsets"]
            out[name] = (path, e["dtype"], e["shape"], 8 + n + b, 8 + n + en)
    return out


class Checkpoint:
    def __init__(self, model_dir):
        import numpy as np

        self.np = np
        self.entries = safetensors_entries(model_dir)
        self.maps = {}

    def has(self, name):
        return name in self.entries

    def get(self, torch, name, device, dtype):
        if name not in self.entries:
            raise KeyError(f"checkpoint has no tensor {name}")
        path, st, shape, b, e = self.entries[name]
        if path not in self.maps:
            self.maps[path] = self.np.memmap(path, dtype=self.np.uint8, mode="r")
        np_dtype, torch_dtype = ST_DTYPES[st]
        arr = self.np.array(self.maps[path][b:e]).view(np_dtype).reshape(shape)
        t = torch.from_numpy(arr)
        if torch_dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        return t.to(device=device, dtype=dtype)


# ---------------------------------------------------------------- the model
def rope_inv_freq(torch, cfg, hd):
    theta = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = cfg.get("rope_scaling")
    kind = (rs or {}).get("rope_type", (rs or {}).get("type", "default")) if rs else "default"
    if kind == "default":
        return inv.float()
    if kind == "llama3":
        factor = rs["factor"]
        lo, hi = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old = rs["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wl >= hi_wl) & (wl <= lo_wl)
        return torch.where(medium, smoothed, scaled).float()
    raise ValueError(f"rope_scaling type {kind!r} is not supported by this baseline")


class Model:
    """Weights on the device, fused: qkv [(nH + 2 nKv) hd, H], gate/up [2 I, H]."""

    def __init__(self, torch, model_dir, device, dtype):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        mt = cfg.get("model_type")
        if mt not in ("qwen3", "qwen2", "llama"):
            raise ValueError(f"model_type {mt!r}: this baseline runs dense qwen3, qwen2 and llama checkpoints")
        if cfg.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported by this baseline")
        self.cfg = cfg
        self.H = cfg["hidden_size"]
        self.nH = cfg["num_attention_heads"]
        self.nKv = cfg.get("num_key_value_heads") or self.nH
        self.hd = cfg.get("head_dim") or self.H // self.nH
        self.G = self.nH // self.nKv
        self.L = cfg["num_hidden_layers"]
        self.V = cfg["vocab_size"]
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.max_pos = cfg.get("max_position_embeddings", 1 << 30)
        ck = Checkpoint(model_dir)
        g = lambda n: ck.get(torch, n, device, dtype)  # noqa: E731
        self.embed = g("model.embed_tokens.weight")
        tied = cfg.get("tie_word_embeddings", False) or not ck.has("lm_head.weight")
        self.lm_head = self.embed if tied else g("lm_head.weight")
        self.final_norm = g("model.norm.weight")
        self.layers = []
        for i in range(self.L):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            lay = {
                "ln1": g(p + "input_layernorm.weight"),
                "ln2": g(p + "post_attention_layernorm.weight"),
                "wqkv": torch.cat([g(a + "q_proj.weight"), g(a + "k_proj.weight"), g(a + "v_proj.weight")], 0).contiguous(),
                "bqkv": torch.cat([g(a + "q_proj.bias"), g(a + "k_proj.bias"), g(a + "v_proj.bias")], 0).contiguous() if ck.has(a + "q_proj.bias") else None,
                "wo": g(a + "o_proj.weight"),
                "qn": g(a + "q_norm.weight") if ck.has(a + "q_norm.weight") else None,
                "kn": g(a + "k_norm.weight") if ck.has(a + "k_norm.weight") else None,
                "wgu": torch.cat([g(p + "mlp.gate_proj.weight"), g(p + "mlp.up_proj.weight")], 0).contiguous(),
                "wd": g(p + "mlp.down_proj.weight"),
            }
            self.layers.append(lay)
        self.qk_norm = self.layers[0]["qn"] is not None
        self.inv_freq = rope_inv_freq(torch, cfg, self.hd)
        self.weight_bytes = sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self):
        seen = {id(self.embed): self.embed}
        for t in [self.lm_head, self.final_norm] + [v for lay in self.layers for v in lay.values() if v is not None]:
            seen[id(t)] = t
        return list(seen.values())


def make_ops(torch, F, m):
    """The element-wise chains, written as HF writes them (RMSNorm in float32, RoPE in the model dtype)."""
    eps, nH, nKv, hd = m.eps, m.nH, m.nKv, m.hd
    qk_norm = m.qk_norm

    def rms_norm(x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * xf.to(x.dtype)

    def add_rms_norm(x, y, w):
        s = x + y
        return s, rms_norm(s, w)

    def rotate(t, c, s):
        half = t.shape[-1] // 2
        rot = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
        return t * c + rot * s

    def qk_prep(qkv, cos, sin, qn, kn):
        r = qkv.shape[0]
        q = qkv[:, : nH * hd].reshape(r, nH, hd)
        k = qkv[:, nH * hd : (nH + nKv) * hd].reshape(r, nKv, hd)
        v = qkv[:, (nH + nKv) * hd :].reshape(r, nKv, hd)
        if qk_norm:
            q = rms_norm(q, qn)
            k = rms_norm(k, kn)
        c = cos[:, None, :]
        s = sin[:, None, :]
        return rotate(q, c, s), rotate(k, c, s), v.contiguous()

    def silu_mul(gu):
        n = gu.shape[-1] // 2
        return F.silu(gu[:, :n]) * gu[:, n:]

    return {"rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "qk_prep": qk_prep, "silu_mul": silu_mul}


class Runner:
    """Slots, the static KV cache, prefill, graph-captured decode steps and the serving loop."""

    def __init__(self, torch, F, m, device, dtype, batch, T, bucket, max_prefill_tokens):
        self.torch, self.F, self.m = torch, F, m
        self.device, self.dtype = device, dtype
        self.B, self.T, self.bucket = batch, T, bucket
        self.max_prefill_tokens = max_prefill_tokens
        self.cuda = device.type == "cuda"
        z = dict(device=device)
        self.k = torch.zeros((m.L, batch, m.nKv, T, m.hd), dtype=dtype, **z)
        self.v = torch.zeros((m.L, batch, m.nKv, T, m.hd), dtype=dtype, **z)
        self.tokens = torch.zeros(batch, dtype=torch.long, **z)
        self.pos = torch.zeros(batch, dtype=torch.long, **z)
        self.bidx = torch.arange(batch, dtype=torch.long, **z)
        self.ar = torch.arange(T, dtype=torch.long, **z)
        self.zero = torch.zeros((), dtype=dtype, **z)
        self.neginf = torch.full((), float("-inf"), dtype=dtype, **z)
        t = torch.arange(T, dtype=torch.float64)
        freqs = torch.outer(t, m.inv_freq.double())
        emb = torch.cat((freqs, freqs), dim=-1)
        # HF computes cos/sin in float32 and casts them to the activations' dtype.
        self.cos = emb.cos().float().to(device=device, dtype=dtype)
        self.sin = emb.sin().float().to(device=device, dtype=dtype)
        self.scale = 1.0 / math.sqrt(m.hd)
        # Captured batch sizes: the whole batch, then halvings down to 1 (compaction targets).
        sizes = [batch]
        b = 1
        while b < batch:
            sizes.append(b)
            b *= 2
        self.batch_sizes = sorted(set(sizes), reverse=True)
        self.buckets = list(range(bucket, T + 1, bucket))
        self.ops = None
        self.attention = "math"
        self.graphs = {}
        self.pool = None

    # -- one decode step over slots [0, nb), attention over KV positions [0, tb)
    def decode_step(self, nb, tb):
        torch, F, m, ops = self.torch, self.F, self.m, self.ops
        ids = self.tokens[:nb]
        p = self.pos[:nb]
        bidx = self.bidx[:nb]
        x = F.embedding(ids, m.embed)
        cos = self.cos[p]
        sin = self.sin[p]
        valid = self.ar[:tb].unsqueeze(0) <= p.unsqueeze(1)
        mask = torch.where(valid, self.zero, self.neginf).view(nb, 1, 1, tb)
        h = ops["rms_norm"](x, m.layers[0]["ln1"])
        for i, lay in enumerate(m.layers):
            qkv = F.linear(h, lay["wqkv"], lay["bqkv"])
            q, k, v = ops["qk_prep"](qkv, cos, sin, lay["qn"], lay["kn"])
            kc, vc = self.k[i], self.v[i]
            kc[bidx, :, p] = k
            vc[bidx, :, p] = v
            a = self.attend_decode(q.view(nb, m.nKv, m.G, m.hd), kc[:nb, :, :tb], vc[:nb, :, :tb], mask)
            o = F.linear(a.reshape(nb, m.nH * m.hd), lay["wo"])
            x, h = ops["add_rms_norm"](x, o, lay["ln2"])
            y = F.linear(ops["silu_mul"](F.linear(h, lay["wgu"])), lay["wd"])
            nxt = m.layers[i + 1]["ln1"] if i + 1 < m.L else m.final_norm
            x, h = ops["add_rms_norm"](x, y, nxt)
        logits = F.linear(h, m.lm_head)
        self.tokens[:nb].copy_(logits.argmax(-1))
        self.pos[:nb].add_(1).clamp_(max=self.T - 1)

    def attend_decode(self, q, k, v, mask):
        """q [nb, nKv, G, hd] (a KV head's query heads grouped: K and V are read once), k/v [nb, nKv, tb, hd]."""
        if self.attention == "sdpa":
            return self.F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        s = self.torch.matmul(q, k.transpose(-1, -2)).float() * self.scale + mask.float()
        return self.torch.matmul(self.torch.softmax(s, dim=-1).to(q.dtype), v)

    def attend_prefill(self, q, k, v):
        """Causal attention over a padded batch: q [nb, nH, P, hd], k/v [nb, nKv, P, hd] (right padding never reaches a real row)."""
        torch = self.torch
        if self.m.G > 1:
            k = k.repeat_interleave(self.m.G, dim=1)
            v = v.repeat_interleave(self.m.G, dim=1)
        if hasattr(self.F, "scaled_dot_product_attention"):
            return self.F.scaled_dot_product_attention(q, k, v, is_causal=True)
        P = q.shape[2]
        s = torch.matmul(q, k.transpose(-1, -2)).float() * self.scale
        causal = torch.ones(P, P, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~causal, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1).to(q.dtype), v)

    def to_device(self, values):
        t = self.torch.tensor(values, dtype=self.torch.long)
        if self.cuda:
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def prefill(self, slots, prompts, first_tok, req_ids):
        """One padded batch: writes each prompt's K/V into its slot, the first token into tokens[slot] and first_tok[req]."""
        torch, F, m, ops = self.torch, self.F, self.m, self.ops
        nb = len(prompts)
        P = max(len(p) for p in prompts)
        ids = self.to_device([p + [0] * (P - len(p)) for p in prompts]).view(-1)
        slot_t = self.to_device(slots)
        last = self.to_device([i * P + len(p) - 1 for i, p in enumerate(prompts)])
        rows = nb * P
        x = F.embedding(ids, m.embed)
        cos = self.cos[:P].repeat(nb, 1)
        sin = self.sin[:P].repeat(nb, 1)
        h = ops["rms_norm"](x, m.layers[0]["ln1"])
        for i, lay in enumerate(m.layers):
            qkv = F.linear(h, lay["wqkv"], lay["bqkv"])
            q, k, v = ops["qk_prep"](qkv, cos, sin, lay["qn"], lay["kn"])
            q = q.view(nb, P, m.nH, m.hd).transpose(1, 2)
            k = k.view(nb, P, m.nKv, m.hd).transpose(1, 2)
            v = v.view(nb, P, m.nKv, m.hd).transpose(1, 2)
            self.k[i][slot_t, :, :P] = k
            self.v[i][slot_t, :, :P] = v
            a = self.attend_prefill(q, k, v)
            o = F.linear(a.transpose(1, 2).reshape(rows, m.nH * m.hd), lay["wo"])
            x, h = ops["add_rms_norm"](x, o, lay["ln2"])
            y = F.linear(ops["silu_mul"](F.linear(h, lay["wgu"])), lay["wd"])
            nxt = m.layers[i + 1]["ln1"] if i + 1 < m.L else m.final_norm
            x, h = ops["add_rms_norm"](x, y, nxt)
        tok = F.linear(h[last], m.lm_head).argmax(-1)
        self.tokens.index_copy_(0, slot_t, tok)
        self.pos.index_copy_(0, slot_t, self.to_device([len(p) for p in prompts]))
        if first_tok is not None:
            first_tok.index_copy_(0, self.to_device(req_ids), tok)

    # -- CUDA graphs
    def capture(self, nb, tb, pool):
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self.decode_step(nb, tb)  # warm-up: compiles what dynamic shapes did not cover, outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            self.decode_step(nb, tb)
        return g

    def capture_all(self):
        torch = self.torch
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs = {}
        for nb in self.batch_sizes:  # largest first: the shared pool is sized by the first
            for tb in reversed(self.buckets):
                self.graphs[(nb, tb)] = self.capture(nb, tb, self.pool)
        self.reset_state()

    def reset_state(self):
        self.tokens.zero_()
        self.pos.zero_()

    def step(self, nb, tb):
        g = self.graphs.get((nb, tb))
        if g is not None:
            g.replay()
        else:
            self.decode_step(nb, tb)

    def time_step(self, nb, tb, iters=5):
        """ms per decode step at (nb, tb), graph-captured when on CUDA."""
        torch = self.torch
        if not self.cuda:
            t = time.perf_counter()
            for _ in range(iters):
                self.decode_step(nb, tb)
            return (time.perf_counter() - t) * 1000 / iters
        g = self.capture(nb, tb, None)
        g.replay()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        ms = e0.elapsed_time(e1) / iters
        del g
        self.reset_state()
        return ms

    # -- the serving loop
    def generate(self, reqs, order, stats=None):
        """Greedy tokens of the requests `order` (indices into reqs), continuous batching over the slots."""
        torch = self.torch
        n = len(reqs)
        first_tok = torch.zeros(n, dtype=torch.long, device=self.device)
        chunk = 1024
        hist = []
        steps = 0
        pending = deque(order)
        free = list(range(self.B))  # kept sorted: admissions take the lowest slots
        active = {}  # slot -> request
        slot_pos = {}  # slot -> position of its next decode input
        remaining = {}
        segments = {r: [] for r in order}
        nb = self.B
        prefill_events = []
        compactions = moves = 0
        active_sum = 0
        while pending or active:
            if pending and free:
                take = min(len(free), len(pending))
                slots = free[:take]
                free = free[take:]
                batch = [pending.popleft() for _ in range(take)]
                # Longest first, in groups of at most max_prefill_tokens padded tokens.
                pairs = sorted(zip(batch, slots), key=lambda rs: -len(reqs[rs[0]]["prompt_ids"]))
                i = 0
                while i < len(pairs):
                    P = len(reqs[pairs[i][0]]["prompt_ids"])
                    j = i + max(1, min(len(pairs) - i, self.max_prefill_tokens // P))
                    grp = pairs[i:j]
                    if self.cuda and stats is not None:
                        e0 = torch.cuda.Event(enable_timing=True)
                        e0.record()
                    self.prefill([s for _, s in grp], [reqs[r]["prompt_ids"] for r, _ in grp], first_tok, [r for r, _ in grp])
                    if self.cuda and stats is not None:
                        e1 = torch.cuda.Event(enable_timing=True)
                        e1.record()
                        prefill_events.append((e0, e1))
                    i = j
                for r, s in pairs:
                    mt = reqs[r]["max_tokens"]
                    if mt <= 1:
                        free.append(s)
                        continue
                    active[s] = r
                    remaining[r] = mt - 1
                    slot_pos[s] = len(reqs[r]["prompt_ids"])
                    segments[r].append([s, steps, None])
                free.sort()
            if not active:
                continue
            if not pending:
                # Compaction: the smallest captured batch that holds the live slots.
                target = min(b for b in self.batch_sizes if b >= len(active))
                if target < nb:
                    movers = sorted(s for s in active if s >= target)
                    holes = [s for s in free if s < target][: len(movers)]
                    if movers:
                        src, dst = self.to_device(movers), self.to_device(holes)
                        for li in range(self.m.L):
                            self.k[li][dst] = self.k[li][src]
                            self.v[li][dst] = self.v[li][src]
                        self.tokens[dst] = self.tokens[src]
                        self.pos[dst] = self.pos[src]
                        for s_old, s_new in zip(movers, holes):
                            r = active.pop(s_old)
                            active[s_new] = r
                            slot_pos[s_new] = slot_pos.pop(s_old)
                            segments[r][-1][2] = steps
                            segments[r].append([s_new, steps, None])
                        free = sorted(set(free) - set(holes) | set(movers))
                        moves += len(movers)
                    compactions += 1
                    nb = target
            longest = max(slot_pos[s] for s in active) + 1
            tb = min(self.T, -(-longest // self.bucket) * self.bucket)
            self.step(nb, tb)
            if steps % chunk == 0:
                hist.append(torch.empty((chunk, self.B), dtype=torch.long, device=self.device))
            hist[-1][steps % chunk].copy_(self.tokens)
            steps += 1
            active_sum += len(active)
            for s in list(active):
                r = active[s]
                slot_pos[s] += 1
                remaining[r] -= 1
                if remaining[r] == 0:
                    segments[r][-1][2] = steps
                    del active[s]
                    del slot_pos[s]
                    free.append(s)
            free.sort()
        if self.cuda:
            torch.cuda.synchronize()
        if stats is not None:
            stats["t_end"] = time.perf_counter()
        first = first_tok.tolist()
        table = torch.cat(hist)[:steps].tolist() if hist else []
        out = {}
        for r in order:
            toks = [first[r]]
            for s, a, b in segments[r]:
                toks.extend(table[t][s] for t in range(a, b))
            if len(toks) != reqs[r]["max_tokens"]:
                raise RuntimeError(f"request {r}: {len(toks)} tokens assembled, max_tokens {reqs[r]['max_tokens']} (bookkeeping bug)")
            out[r] = toks
        if stats is not None:
            stats["decode_steps"] = steps
            stats["mean_active"] = round(active_sum / steps, 2) if steps else 0
            stats["compactions"] = compactions
            stats["slot_moves"] = moves
            if prefill_events:
                stats["prefill_s"] = round(sum(a.elapsed_time(b) for a, b in prefill_events) / 1000, 3)
        self.reset_state()
        return out


def version_of(name):
    try:
        import importlib

        return importlib.import_module(name).__version__
    except Exception:
        return None


def choose_ops(torch, F, m, runner, want, notes):
    """Eager ops, or torch.compile'd ones when they compile and agree with eager (returns ops, 'compiled'|'eager')."""
    eager = make_ops(torch, F, m)
    if want == "off" or not hasattr(torch, "compile"):
        if want == "on":
            raise RuntimeError("--compile on, but this torch has no torch.compile")
        if want != "off":
            notes.append("torch.compile unavailable: eager element-wise ops")
        return eager, "eager"
    if want == "auto" and not runner.cuda:
        notes.append("torch.compile skipped on CPU (auto)")
        return eager, "eager"
    try:
        import torch._dynamo as dynamo

        for key in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(dynamo.config, key):
                setattr(dynamo.config, key, max(getattr(dynamo.config, key), 256))
        compiled = {k: torch.compile(f, dynamic=True, fullgraph=True) for k, f in eager.items()}
        # Compile here (two row counts each, so the dynamic kernels exist) and check against eager.
        dev, dt = runner.device, runner.dtype
        lay = m.layers[0]
        for rows in (runner.B, 3 * runner.B + 5):
            gen = torch.Generator(device="cpu").manual_seed(rows)
            rnd = lambda *s: (torch.randn(*s, generator=gen) * 0.5).to(device=dev, dtype=dt)  # noqa: E731
            x, y = rnd(rows, m.H), rnd(rows, m.H)
            qkv = rnd(rows, (m.nH + 2 * m.nKv) * m.hd)
            gu = rnd(rows, lay["wgu"].shape[0])
            at = torch.arange(rows, device=dev) % runner.T
            cs, sn = runner.cos[at], runner.sin[at]
            pairs = [
                (eager["rms_norm"](x, lay["ln1"]), compiled["rms_norm"](x, lay["ln1"])),
                (eager["add_rms_norm"](x, y, lay["ln2"]), compiled["add_rms_norm"](x, y, lay["ln2"])),
                (eager["qk_prep"](qkv, cs, sn, lay["qn"], lay["kn"]), compiled["qk_prep"](qkv, cs, sn, lay["qn"], lay["kn"])),
                (eager["silu_mul"](gu), compiled["silu_mul"](gu)),
            ]
            for a, b in pairs:
                a = a if isinstance(a, tuple) else (a,)
                b = b if isinstance(b, tuple) else (b,)
                for u, w in zip(a, b):
                    err = (u.float() - w.float()).abs().max().item()
                    ref = u.float().abs().max().item() + 1e-6
                    if not err <= 0.02 * ref:
                        raise RuntimeError(f"compiled op differs from eager by {err:.3g} (max |x| {ref:.3g})")
        return compiled, "compiled"
    except Exception as e:  # noqa: BLE001 - any compile failure falls back
        if want == "on":
            raise
        notes.append(f"torch.compile failed, eager element-wise ops: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return eager, "eager"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--out", default=None, help="also write the JSON line here")
    ap.add_argument("--print-sha", action="store_true", help="print the workload's sha256 and exit (no torch needed)")
    ap.add_argument("--batch-size", default="auto", help="slots (default auto: what 85%% of free device memory holds, at most 256 and the request count)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--device", default=None, help="cuda (default where available) or cpu")
    ap.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--graphs", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--attention", default="auto", choices=["auto", "sdpa", "math"])
    ap.add_argument("--kv-bucket", type=int, default=256, help="KV length granularity of the captured decode steps")
    ap.add_argument("--max-prefill-tokens", type=int, default=16384, help="padded tokens per prefill batch")
    ap.add_argument("--check-tokens", type=int, default=0, help="also generate the first N requests alone and report their tokens")
    ap.add_argument("--tokens-out", default=None, help="write every request's batched tokens as JSON")
    a = ap.parse_args()

    if a.print_sha:
        print(workload_sha256(load_workload(a.workload)))
        return 0
    if not a.model:
        ap.error("--model is required")
    if a.kv_bucket < 1 or a.max_prefill_tokens < 1 or a.check_tokens < 0:
        ap.error("--kv-bucket and --max-prefill-tokens must be positive, --check-tokens non-negative")

    res = {
        "probe": "torch_throughput",
        "model": a.model,
        "output_tok_s": None,
        "versions": {"python": sys.version.split()[0], "torch": version_of("torch"), "transformers": version_of("transformers"), "numpy": version_of("numpy")},
    }
    notes = []
    res["notes"] = notes

    def finish(status):
        line = json.dumps(res)
        print(line, flush=True)
        if a.out:
            with open(a.out, "w") as f:
                f.write(line + "\n")
        return status

    try:
        w = load_workload(a.workload)
        res["workload_sha256"] = workload_sha256(w)
        reqs = w["requests"]
        res["requests"] = len(reqs)
        res["prompt_tokens"] = sum(len(r["prompt_ids"]) for r in reqs)
        res["max_output_tokens"] = sum(r["max_tokens"] for r in reqs)
        import torch
        import torch.nn.functional as F

        device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda, but torch sees no CUDA device")
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
        res["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        res["dtype"] = a.dtype
        if device.type == "cuda":
            res["versions"]["cuda"] = torch.version.cuda
            torch.backends.cuda.matmul.allow_tf32 = True
        torch.set_grad_enabled(False)

        t0 = time.perf_counter()
        m = Model(torch, a.model, device, dtype)
        if w["token_id_limit"] > m.V:
            raise ValueError(f"workload token ids reach {w['token_id_limit'] - 1}, past the vocabulary ({m.V})")
        res["load_s"] = round(time.perf_counter() - t0, 2)
        res["weight_bytes"] = m.weight_bytes
        longest = max(len(r["prompt_ids"]) + r["max_tokens"] for r in reqs)
        if longest > m.max_pos:
            raise ValueError(f"the longest request needs {longest} positions; the model has {m.max_pos}")
        T = -(-longest // a.kv_bucket) * a.kv_bucket
        per_slot = 2 * m.L * m.nKv * T * m.hd * torch.tensor([], dtype=dtype).element_size()
        if a.batch_size == "auto":
            if device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(device)
                room = int(0.85 * free) - (3 << 30)
                B = max(1, min(256, len(reqs), room // per_slot))
            else:
                B = min(256, len(reqs))
        else:
            B = int(a.batch_size)
            if B < 1:
                raise ValueError("--batch-size must be positive")
        runner = Runner(torch, F, m, device, dtype, B, T, a.kv_bucket, a.max_prefill_tokens)
        res["batch_size"] = B
        res["kv_len"] = T
        res["kv_bucket"] = a.kv_bucket
        res["kv_cache_bytes"] = per_slot * B
        res["graph_batch_sizes"] = runner.batch_sizes

        # Element-wise ops: compiled where it works.
        t1 = time.perf_counter()
        compiled_ops, ops_mode = choose_ops(torch, F, m, runner, a.compile, notes)
        res["compile_s"] = round(time.perf_counter() - t1, 2)
        eager_ops = make_ops(torch, F, m)
        use_graphs = device.type == "cuda" and a.graphs != "off"
        if a.graphs == "on" and device.type != "cuda":
            raise RuntimeError("--graphs on needs a CUDA device")
        has_sdpa = hasattr(F, "scaled_dot_product_attention")
        if a.attention == "sdpa" and not has_sdpa:
            raise RuntimeError("--attention sdpa, but this torch has no scaled_dot_product_attention")
        attn_choices = ["sdpa", "math"] if a.attention == "auto" and has_sdpa else ["math"] if a.attention == "auto" else [a.attention]
        ops_choices = [("compiled", compiled_ops), ("eager", eager_ops)] if ops_mode == "compiled" else [("eager", eager_ops)]

        # Pick the fastest decode step at the largest shapes (the whole batch at the longest and at half the KV).
        t2 = time.perf_counter()
        timings = {}
        best = None
        shapes = [(B, T)] + ([(B, runner.buckets[(len(runner.buckets) - 1) // 2])] if len(runner.buckets) > 1 else [])
        for on, ops in ops_choices:
            for at in attn_choices:
                runner.ops, runner.attention = ops, at
                try:
                    ms = sum(runner.time_step(nb, tb) for nb, tb in shapes)
                except Exception as e:  # noqa: BLE001 - a candidate that cannot run is skipped
                    notes.append(f"decode candidate {on}+{at} failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                    continue
                timings[f"{on}+{at}"] = round(ms, 3)
                if best is None or ms < best[0]:
                    best = (ms, on, ops, at)
        if best is None:
            raise RuntimeError("no decode configuration ran (see notes)")
        _, on, runner.ops, runner.attention = best
        res["step_ms_candidates"] = timings
        res["step_ms_shapes"] = [list(s) for s in shapes]

        graphs_mode = "none"
        if use_graphs:
            try:
                runner.capture_all()
                graphs_mode = "cuda-graphs"
            except Exception as e:  # noqa: BLE001
                if a.graphs == "on":
                    raise
                runner.graphs = {}
                runner.reset_state()
                notes.append(f"CUDA graph capture failed, eager decode steps: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        res["graphs"] = len(runner.graphs)
        res["capture_s"] = round(time.perf_counter() - t2, 2)
        res["element_ops"] = on
        res["attention"] = runner.attention
        res["mode"] = f"{graphs_mode}+{on}+{runner.attention}"
        res["batching"] = "continuous (slot refill, prefill first; compaction into smaller captured batches once the queue is empty)"

        # Warm-up outside the figures: a short batched prefill and a few decode steps.
        warm = [{"prompt_ids": [1 + (i % 7)] * (16 + i), "max_tokens": 4} for i in range(min(B, 4))]
        runner.generate(warm, list(range(len(warm))))

        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        stats = {}
        t3 = time.perf_counter()
        out = runner.generate(reqs, list(range(len(reqs))), stats)
        total = stats.pop("t_end") - t3  # the last token is on the device; reading them back is not timed
        n_out = sum(len(t) for t in out.values())
        res.update(stats)
        res["total_s"] = round(total, 3)
        res["output_tokens"] = n_out
        res["output_tok_s"] = round(n_out / total, 2)
        res["total_tok_s"] = round((res["prompt_tokens"] + n_out) / total, 2)
        if device.type == "cuda":
            res["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        if a.tokens_out:
            with open(a.tokens_out, "w") as f:
                json.dump({"workload_sha256": res["workload_sha256"], "tokens": [out[i] for i in range(len(reqs))]}, f, separators=(",", ":"))
        if a.check_tokens > 0:
            # The same requests alone (one slot, the batch-1 graphs): tokens for comparing with NERVA.
            t4 = time.perf_counter()
            checks = []
            for i in range(min(a.check_tokens, len(reqs))):
                alone = runner.generate(reqs, [i])[i]
                d = next((j for j, (u, v) in enumerate(zip(out[i], alone)) if u != v), -1)
                checks.append({"index": i, "tokens": alone, "batched_equal_alone": d < 0, "batched_first_divergence": d})
            res["check_tokens"] = checks
            res["check_s"] = round(time.perf_counter() - t4, 2)
        return finish(0)
    except Exception as e:  # noqa: BLE001 - the line must say what went wrong
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc().splitlines()[-12:]
        return finish(1)


if __name__ == "__main__":
    sys.exit(main())
