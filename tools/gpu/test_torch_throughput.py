#!/usr/bin/env python3
"""Tests of tools/gpu/torch_throughput.py that run without a GPU.

    python3 -m unittest discover -s tools/gpu -p 'test_torch_throughput.py'

The workload part needs only the standard library. The model part needs torch (any version from
1.13: Debian's python3-torch runs the eager paths on the CPU) and numpy, and is skipped without
them: it runs the baseline in float32 on the fixture models of ../shared/fixtures and checks
(1) that its greedy tokens are transformers' float64 greedy tokens in each fixture's
reference.json (all of them agree in float32), and (2) that continuous batching (refills, KV buckets, slot compaction) gives
every request the tokens it gets alone."""
import hashlib
import importlib.util
import json
import os
import random
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_throughput as tt  # noqa: E402

FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "fixtures", "models"))
HAS_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("numpy") is not None
DENSE = ["tiny-random-qwen3", "tiny-random-qwen2", "tiny-random-llama", "tiny-random-llama-sharded", "tiny-shakespeare-qwen3"]


def workload(seed, n, lo, hi_in, hi_out, limit):
    rng = random.Random(seed)
    reqs = [{"prompt_ids": [rng.randrange(limit) for _ in range(rng.randint(lo, hi_in))], "max_tokens": rng.randint(lo, hi_out)} for _ in range(n)]
    return {"seed": seed, "min_len": lo, "max_input_len": hi_in, "max_output_len": hi_out, "token_id_limit": limit, "requests": reqs}


class WorkloadTest(unittest.TestCase):
    def test_sha_is_that_of_the_canonical_bytes(self):
        w = workload(1, 5, 3, 9, 9, 50)
        text = tt.canonical_workload_json(w)
        self.assertTrue(text.startswith('{"seed":1,"min_len":3,"max_input_len":9,"max_output_len":9,"token_id_limit":50,"requests":[{"prompt_ids":['))
        self.assertNotIn(" ", text)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "w.json")
            with open(p, "w") as f:
                f.write(text)
            back = tt.load_workload(p)
            with open(p, "rb") as f:
                self.assertEqual(tt.workload_sha256(back), hashlib.sha256(f.read()).hexdigest())
            # Extra keys in a file do not change the id; key order in the file does not either.
            shuffled = {"requests": w["requests"], "extra": 1, **{k: w[k] for k in reversed(tt.WORKLOAD_KEYS)}}
            with open(p, "w") as f:
                json.dump(shuffled, f, indent=2)
            self.assertEqual(tt.workload_sha256(tt.load_workload(p)), hashlib.sha256(text.encode()).hexdigest())

    def test_bad_workloads_are_refused(self):
        w = workload(1, 2, 3, 9, 9, 50)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "w.json")
            for bad, msg in [
                ({**w, "requests": []}, "no non-empty 'requests'"),
                ({**w, "requests": [{"prompt_ids": [50], "max_tokens": 2}]}, "ids in [0, 50)"),
                ({**w, "requests": [{"prompt_ids": [1], "max_tokens": 0}]}, "max_tokens must be a positive integer"),
                ({k: v for k, v in w.items() if k != "seed"}, "'seed' must be an integer"),
            ]:
                with open(p, "w") as f:
                    json.dump(bad, f)
                with self.assertRaises(ValueError) as cm:
                    tt.load_workload(p)
                self.assertIn(msg, str(cm.exception))


@unittest.skipUnless(HAS_TORCH and os.path.isdir(FIXTURES), "needs torch, numpy and ../shared/fixtures")
class ModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import torch
        import torch.nn.functional as F

        torch.set_grad_enabled(False)
        cls.torch, cls.F = torch, F

    def runner(self, model, batch, T, bucket, max_prefill_tokens=64):
        torch, F = self.torch, self.F
        r = tt.Runner(torch, F, model, torch.device("cpu"), torch.float32, batch, T, bucket, max_prefill_tokens)
        r.ops = tt.make_ops(torch, F, model)
        r.attention = "math"
        return r

    def test_greedy_tokens_match_transformers_float64(self):
        torch = self.torch
        for name in DENSE:
            d = os.path.join(FIXTURES, name)
            with open(os.path.join(d, "reference.json")) as f:
                ref = json.load(f)
            m = tt.Model(torch, d, torch.device("cpu"), torch.float32)
            reqs = [{"prompt_ids": c["prompt_ids"], "max_tokens": ref["new_tokens"]} for c in ref["cases"]]
            T = max(len(q["prompt_ids"]) + q["max_tokens"] for q in reqs)
            out = self.runner(m, len(reqs), -(-T // 16) * 16, 16).generate(reqs, list(range(len(reqs))))
            for i, c in enumerate(ref["cases"]):
                want = c["greedy_f64"]
                got = out[i]
                d_at = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), -1)
                self.assertEqual(got, want, f"{name} case {i}: first difference at token {d_at}")

    def test_batched_tokens_equal_alone_across_refills_buckets_and_compaction(self):
        torch = self.torch
        d = os.path.join(FIXTURES, "tiny-random-qwen3")
        m = tt.Model(torch, d, torch.device("cpu"), torch.float32)
        w = workload(7, 23, 2, 40, 40, 512)
        reqs = w["requests"]
        T = -(-max(len(q["prompt_ids"]) + q["max_tokens"] for q in reqs) // 8) * 8
        alone = {}
        one = self.runner(m, 1, T, 8)
        for i in range(len(reqs)):
            alone[i] = one.generate(reqs, [i])[i]
            self.assertEqual(len(alone[i]), reqs[i]["max_tokens"])
        for batch in (5, 23):
            r = self.runner(m, batch, T, 8, max_prefill_tokens=50)
            stats = {}
            out = r.generate(reqs, list(range(len(reqs))), stats)
            self.assertGreater(stats["compactions"], 0)
            if batch == 23:
                self.assertGreater(stats["slot_moves"], 0)
            for i in range(len(reqs)):
                self.assertEqual(out[i], alone[i], f"batch {batch}, request {i}")

    def test_max_tokens_one_and_unsupported_models(self):
        torch = self.torch
        d = os.path.join(FIXTURES, "tiny-random-qwen3")
        m = tt.Model(torch, d, torch.device("cpu"), torch.float32)
        reqs = [{"prompt_ids": [5, 6, 7], "max_tokens": 1}, {"prompt_ids": [8], "max_tokens": 3}]
        out = self.runner(m, 2, 16, 8).generate(reqs, [0, 1])
        self.assertEqual([len(out[0]), len(out[1])], [1, 3])
        with self.assertRaises(ValueError):
            tt.Model(torch, os.path.join(FIXTURES, "tiny-random-qwen3-moe"), torch.device("cpu"), torch.float32)


if __name__ == "__main__":
    unittest.main()
