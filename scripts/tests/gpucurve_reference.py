"""Run by test_gpucurve.py with a Python that has torch: one mixed step of the tiny
Qwen3-shaped model (decodes over cached context and a prompt chunk after a prefix), its
logits against a plain float32 evaluation written out token by token and head by head
(each query head reads KV head h // group; a decode sees its cache and its new token; a
chunk token sees the prefix and the chunk up to itself). Prints the largest difference
relative to the largest logit and exits 1 above the bound."""

from __future__ import annotations

import math
import sys

import torch

from gpucurve.model import TINY, Attention, Model, Step

BOUND = 0.02  # bf16 through two layers against float32


def reference(step: Step, caches: list[torch.Tensor | None]) -> torch.Tensor:
    m, cfg = step.m, step.m.cfg
    b, l, n, c = step.b, step.l, step.n, step.c
    nh, nkv, hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    group, tokens = nh // nkv, b + n
    dk, dv, pk, pv = caches
    x = m.embed.float()[step.ids]
    cos, sin = m.cos.float()[step.pos][:, None, :], m.sin.float()[step.pos][:, None, :]

    def rope(v):
        v1, v2 = v.chunk(2, dim=-1)
        return torch.cat((v1 * cos - v2 * sin, v2 * cos + v1 * sin), dim=-1)

    def rms(v, w):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()

    def attend(qv, keys, values):
        return torch.softmax(keys @ qv / math.sqrt(hd), dim=0) @ values

    for layer in m.layers:
        h = rms(x, layer["ln1"])
        q, k, v = (h @ layer["qkv"].float().T).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = rope(rms(q.view(tokens, nh, hd), layer["q_norm"]))
        k = rope(rms(k.view(tokens, nkv, hd), layer["k_norm"]))
        v = v.view(tokens, nkv, hd)
        out = torch.empty(tokens, nh, hd)
        for i in range(b):
            keys, values = dk[i].float().clone(), dv[i].float().clone()  # [nkv, l, hd]
            keys[:, l - 1], values[:, l - 1] = k[i], v[i]
            for head in range(nh):
                out[i, head] = attend(q[i, head], keys[head // group], values[head // group])
        if n:
            keys, values = pk[0].float().clone(), pv[0].float().clone()  # [nkv, c + n, hd]
            keys[:, c:], values[:, c:] = k[b:].transpose(0, 1), v[b:].transpose(0, 1)
            for j in range(n):
                for head in range(nh):
                    g = head // group
                    out[b + j, head] = attend(q[b + j, head], keys[g, : c + j + 1], values[g, : c + j + 1])
        x = x + out.reshape(tokens, nh * hd) @ layer["o"].float().T
        gate, up = (rms(x, layer["ln2"]) @ layer["gate_up"].float().T).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ layer["down"].float().T
    return rms(x[step.last], m.norm) @ m.lm_head.float().T


def main() -> int:
    torch.manual_seed(0)
    model = Model(torch, TINY, "cpu", max_pos=64)
    step = Step(model, Attention(torch, "cpu"), b=3, l=9, n=5, c=4)
    caches = [t.clone() if t is not None else None for t in (step.dk, step.dv, step.pk, step.pv)]
    step.run()
    want = reference(step, caches)
    diff = (step.logits - want).abs().max().item() / want.abs().max().item()
    print(f"largest logit difference / largest logit: {diff:.4f} (bound {BOUND})")
    return 0 if diff <= BOUND else 1


if __name__ == "__main__":
    sys.exit(main())
