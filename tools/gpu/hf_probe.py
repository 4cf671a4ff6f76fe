"""Helpers shared by the GPU machine's transformers scripts (oracle_parity.py, bf16_floor.py)."""
import numpy as np
import torch


def rel_per_step(a, b):
    """Per step: max |a - b| / max |b| (b is the reference)."""
    return [float(np.abs(a[i] - b[i]).max() / np.abs(b[i]).max()) for i in range(len(b))]


def nudge_layer0(model, fraction, seed=1):
    """Move a random `fraction` of layer 0's bf16 outputs by one ulp on every forward: the smallest
    change a second, not bit-identical bf16 implementation makes (cuBLAS and a correctly rounded
    dot product already differ on ~0.1 % of a GEMV's outputs). Returns the hook handle."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def nudge(mod, inp, out):
        h = out[0] if isinstance(out, tuple) else out
        mask = (torch.rand(h.shape, generator=gen) < fraction).to(h.device)
        h2 = torch.where(mask, (h.view(torch.int16) + 1).view(torch.bfloat16), h)
        return (h2,) + tuple(out[1:]) if isinstance(out, tuple) else h2

    return model.model.layers[0].register_forward_hook(nudge)
