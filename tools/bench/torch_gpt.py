#!/usr/bin/python3
"""CPU training benchmark, PyTorch side: a plain PyTorch GPT-2 of the same shape as
zerod_train_bench (learned positions, pre-LayerNorm, GELU(tanh) MLP 4x, tied embeddings,
vocabulary padded to a multiple of 128), torch.optim.AdamW, random tokens.

Modes (flags), for the modern-PyTorch baselines of tools/bench/train_bench.sh --baselines:
  --attention manual|sdpa   hand-written masked softmax (torch 1.13) or
                            F.scaled_dot_product_attention(is_causal=True) (torch >= 2.0)
  --compile                 torch.compile(model) (inductor; forward and backward)
  --autocast bf16           forward and loss under torch.autocast("cpu", bfloat16), fp32 weights
  --adamw default|foreach|fused   torch.optim.AdamW's implementation
Run with Debian's python3 (python3-torch 1.13) for the plain fp32 baseline:
  /usr/bin/python3 torch_gpt.py --json
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        k = k.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        v = v.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        if mask is None:  # --attention sdpa
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, NH, C, V, T, sdpa=False):
        super().__init__()
        self.sdpa = sdpa
        Vp = (V + 127) // 128 * 128
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") or n.endswith("mlp_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x, None if self.sdpa else self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head over the padded vocabulary
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def shape_args():
    """The flags of zerod_train_bench's GPT-2 bench shape and step counts, same defaults."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--json", action="store_true")
    return ap


def main():
    ap = shape_args()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--attention", choices=["manual", "sdpa"], default="manual")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none")
    ap.add_argument("--adamw", choices=["default", "foreach", "fused"], default="default")
    a, _ = ap.parse_known_args()  # zerod-only flags (e.g. --dtype) are ignored
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = GPT(a.layers, a.heads, a.embd, a.vocab, a.seq, sdpa=a.attention == "sdpa")
    impl = {} if a.adamw == "default" else {a.adamw: True}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **impl)
    run = torch.compile(model) if a.compile else model
    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq))
        y = torch.randint(0, a.vocab, (a.batch, a.seq))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = run(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    tps = a.batch * a.seq / median
    result = {"tokens_per_s": round(tps, 1), "step_ms": round(median * 1e3, 1), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "loss": loss.item(), "steps": len(times),
              "min_step_ms": round(min(times) * 1e3, 1), "max_step_ms": round(max(times) * 1e3, 1),
              "mode": {"attention": a.attention, "compile": a.compile, "autocast": a.autocast, "adamw": a.adamw}}
    if a.json:
        print(json.dumps(result))
    else:
        print(f"pytorch {torch.__version__}: {tps:.0f} tokens/s (median step {median * 1e3:.1f} ms, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
