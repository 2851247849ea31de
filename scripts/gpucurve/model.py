"""A Qwen3-shaped decoder with random weights and one engine step of a given shape."""

from __future__ import annotations

import math

QWEN3_8B = dict(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288,
                vocab=151_936, rope_theta=1_000_000.0)
# For trying the script on a CPU (`--config tiny --device cpu`): same structure, small.
TINY = dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, vocab=1000,
            rope_theta=10_000.0)


class Model:
    """The weights of a Qwen3-shaped decoder, random, in bf16 on one device."""

    def __init__(self, torch, cfg: dict, device: str, max_pos: int):
        self.t, self.cfg, self.device = torch, cfg, device
        dt = torch.bfloat16
        h, hd, nh, nkv, inter = cfg["hidden"], cfg["head_dim"], cfg["heads"], cfg["kv_heads"], cfg["intermediate"]

        def w(out_f, in_f):
            return torch.empty(out_f, in_f, dtype=dt, device=device).normal_(0.0, in_f ** -0.5)

        self.embed = w(cfg["vocab"], h)
        self.lm_head = w(cfg["vocab"], h)
        self.norm = torch.ones(h, dtype=dt, device=device)
        self.layers = []
        for _ in range(cfg["layers"]):
            self.layers.append(dict(
                ln1=torch.ones(h, dtype=dt, device=device), ln2=torch.ones(h, dtype=dt, device=device),
                qkv=w((nh + 2 * nkv) * hd, h), q_norm=torch.ones(hd, dtype=dt, device=device),
                k_norm=torch.ones(hd, dtype=dt, device=device), o=w(h, nh * hd),
                gate_up=w(2 * inter, h), down=w(h, inter)))
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(max_pos, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = ang.cos().to(dt), ang.sin().to(dt)

    def params(self) -> int:
        n = self.embed.numel() + self.lm_head.numel() + self.norm.numel()
        return n + sum(v.numel() for layer in self.layers for v in layer.values())


class Step:
    """One engine step of a fixed shape: its inputs, its KV cache, and `run()`."""

    def __init__(self, m: Model, attention, b: int, l: int, n: int, c: int):
        t, cfg, dev = m.t, m.cfg, m.device
        self.m, self.attention, self.b, self.l, self.n, self.c = m, attention, b, l, n, c
        nkv, hd = cfg["kv_heads"], cfg["head_dim"]
        gen = t.Generator(device=dev).manual_seed(b * 1_000_003 + l * 7919 + n * 31 + c)
        self.ids = t.randint(0, cfg["vocab"], (b + n,), device=dev, generator=gen)
        pos = [l - 1] * b + list(range(c, c + n))
        self.pos = t.tensor(pos, device=dev, dtype=t.long)
        # The token whose logits are sampled: each decode, and the chunk's last token.
        self.last = t.tensor(list(range(b)) + ([b + n - 1] if n else []), device=dev, dtype=t.long)
        kv = lambda rows, length: t.empty(rows, nkv, length, hd, dtype=t.bfloat16, device=dev).normal_()
        self.dk, self.dv = (kv(b, l), kv(b, l)) if b else (None, None)
        self.pk, self.pv = (kv(1, c + n), kv(1, c + n)) if n else (None, None)

    def run(self):
        t, m, cfg = self.m.t, self.m, self.m.cfg
        F = t.nn.functional
        b, n, c = self.b, self.n, self.c
        nh, nkv, hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        group = nh // nkv
        tokens = b + n
        x = F.embedding(self.ids, m.embed)
        cos, sin = m.cos[self.pos].unsqueeze(1), m.sin[self.pos].unsqueeze(1)

        def rope(v):
            v1, v2 = v.chunk(2, dim=-1)
            return t.cat((v1 * cos - v2 * sin, v2 * cos + v1 * sin), dim=-1)

        for layer in m.layers:
            h = F.rms_norm(x, (cfg["hidden"],), layer["ln1"], 1e-6)
            qkv = F.linear(h, layer["qkv"])
            q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q = rope(F.rms_norm(q.view(tokens, nh, hd), (hd,), layer["q_norm"], 1e-6))
            k = rope(F.rms_norm(k.view(tokens, nkv, hd), (hd,), layer["k_norm"], 1e-6))
            v = v.view(tokens, nkv, hd)
            outs = []
            if b:
                self.dk[:, :, self.l - 1] = k[:b]
                self.dv[:, :, self.l - 1] = v[:b]
                qd = q[:b].view(b, nkv, group, hd)
                outs.append(self.attention.decode(qd, self.dk, self.dv).reshape(b, nh * hd))
            if n:
                self.pk[0, :, c:c + n] = k[b:].transpose(0, 1)
                self.pv[0, :, c:c + n] = v[b:].transpose(0, 1)
                qp = q[b:].transpose(0, 1).unsqueeze(0)
                o = self.attention.prefill(qp, self.pk, self.pv, c)
                outs.append(o[0].transpose(0, 1).reshape(n, nh * hd))
            a = outs[0] if len(outs) == 1 else t.cat(outs, dim=0)
            x = x + F.linear(a, layer["o"])
            h = F.rms_norm(x, (cfg["hidden"],), layer["ln2"], 1e-6)
            g, u = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, layer["down"])
        h = F.rms_norm(x[self.last], (cfg["hidden"],), m.norm, 1e-6)
        logits = F.linear(h, m.lm_head).float()
        self.logits = logits  # kept (not copied) for checking the step against a reference
        return t.softmax(logits, dim=-1).argmax(dim=-1)


class Attention:
    """scaled_dot_product_attention, pinned to FlashAttention where it takes the call.

    The prompt-chunk path is chosen by trying it: FlashAttention with grouped KV heads
    (no copy), else the KV heads repeated to the query heads (a copy per layer, which the
    report then says). Each is checked against a float32 evaluation before it is used."""

    def __init__(self, torch, device: str):
        self.t, self.device = torch, device
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right
        self.sdpa_kernel, self.causal_lower_right = sdpa_kernel, causal_lower_right
        cuda = device.startswith("cuda")
        self.fast = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION] if cuda else [SDPBackend.MATH]
        self.decode_path = self._pick_decode()
        self.prefill_path = self._pick_prefill()

    def _sdpa(self, backends, q, k, v, **kw):
        with self.sdpa_kernel(backends):
            return self.t.nn.functional.scaled_dot_product_attention(q, k, v, **kw)

    def decode(self, q, k, v):
        return self._sdpa(self.decode_path, q, k, v)

    def prefill(self, q, k, v, c: int):
        n = q.shape[2]
        kw = dict(is_causal=True) if c == 0 else dict(attn_mask=self.causal_lower_right(n, c + n))
        if self.prefill_path == "grouped":
            return self._sdpa(self.fast, q, k, v, enable_gqa=True, **kw)
        group = q.shape[1] // k.shape[1]
        return self._sdpa(self.fast, q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), **kw)

    def _reference(self, q, k, v, c):
        t = self.t
        group = q.shape[1] // k.shape[1]
        k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
        s = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        n, total = q.shape[2], k.shape[2]
        allowed = t.arange(total, device=q.device)[None, :] <= (t.arange(n, device=q.device)[:, None] + c)
        return t.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1) @ v

    def _pick_decode(self):
        t = self.t
        q = t.randn(3, 2, 4, 64, device=self.device, dtype=t.bfloat16)
        k, v = (t.randn(3, 2, 50, 64, device=self.device, dtype=t.bfloat16) for _ in range(2))
        for backends in ([self.fast[0]], self.fast, None):
            if backends is None:
                raise SystemExit("no attention backend takes the decode call")
            try:
                got = self._sdpa(backends, q, k, v)
            except RuntimeError:
                continue
            want = t.softmax(q.float() @ k.float().transpose(-1, -2) / 8.0, -1) @ v.float()
            if (got.float() - want).abs().max().item() < 2e-2:
                return backends

    def _pick_prefill(self):
        t = self.t
        for path in ("grouped", "repeated"):
            self.prefill_path = path
            ok = True
            for n, c in ((24, 0), (24, 40)):
                q = t.randn(1, 8, n, 64, device=self.device, dtype=t.bfloat16)
                k, v = (t.randn(1, 2, c + n, 64, device=self.device, dtype=t.bfloat16) for _ in range(2))
                try:
                    got = self.prefill(q, k, v, c)
                except (RuntimeError, TypeError):
                    ok = False
                    break
                if (got.float() - self._reference(q, k, v, c)).abs().max().item() > 2e-2:
                    ok = False
                    break
            if ok:
                return path
        raise SystemExit("no attention backend takes a causal prompt chunk")
