#!/usr/bin/env python3
"""PyTorch baseline of zerod's GPU benchmark: GPT-2 124M training throughput and MFU.

One training step = forward + backward + gradient clipping + fused AdamW on one micro-batch of
synthetic tokens (no gradient accumulation), under bf16 autocast, with
F.scaled_dot_product_attention(is_causal=True) and torch.compile. The micro-batch is the largest
power of two from 8 up to 64 whose step runs without running out of memory (searched in eager
mode, which needs more memory than the compiled model), unless --batch is given.

Prints one JSON line on stdout (progress goes to stderr). The FLOP count per token is nanoGPT's
and llm.c's estimate (PaLM paper, appendix B):

    flops_per_token = 6 * N + 12 * L * H * Q * T

N: parameters (token embedding counted once: it is tied to the output layer, which is a matmul;
position embeddings, LayerNorms and biases included, as llm.c does), L: layers, H: heads,
Q: head size (embd / heads), T: sequence length. 6 * N is the forward (2) and backward (4)
FLOPs of the weight matmuls, 12 * L * H * Q * T those of QK^T and AV (causal masking not
discounted). MFU = flops_per_token * tokens_per_s / peak, peak = 989e12 FLOP/s (H100/H200 SXM
dense bf16, the datasheet's number) unless --peak-flops says otherwise.

Smoke test without a GPU (old torch, no torch.compile):
    python3 tools/device/gpu_bench.py --device cpu --layers 2 --embd 128 --heads 4 --seq 128 \
        --batch 2 --steps 3 --warmup 1 --no-compile
"""
import argparse
import inspect
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def log(*a):
    print("gpu_bench:", *a, file=sys.stderr, flush=True)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, embd, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(embd)
        self.qkv = nn.Linear(embd, 3 * embd)
        self.attn_out = nn.Linear(embd, embd)
        self.ln2 = nn.LayerNorm(embd)
        self.fc = nn.Linear(embd, 4 * embd)
        self.fc_out = nn.Linear(4 * embd, embd)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (b, t, c) -> (b, heads, t, head_size)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (the CPU smoke test only): the same thing written out
            s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = s.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.attn_out(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, heads, embd):
        super().__init__()
        self.tok = nn.Embedding(vocab, embd)
        self.pos = nn.Embedding(seq, embd)
        self.blocks = nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embd)
        self.head = nn.Linear(embd, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("attn_out.weight") or name.endswith("fc_out.weight"):
                    std /= math.sqrt(2 * layers)  # residual projections, GPT-2's scaling
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def make_optimizer(model, device, lr=6e-4):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {}
    fused = device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    if fused:
        kw["fused"] = True
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **kw), fused


def is_oom(e):
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257, help="tokens drawn from [0, vocab)")
    ap.add_argument("--vocab-padded", type=int, default=50304, help="embedding rows (vocab padded)")
    ap.add_argument("--batch", type=int, default=0, help="micro-batch; 0: search 8..64 in powers of two")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm clip (0: none)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-autocast", action="store_true", help="fp32 instead of bf16 autocast")
    ap.add_argument("--peak-flops", type=float, default=989e12)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_bench: no CUDA device visible to PyTorch (use --device cpu for a smoke test)")
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    model = GPT(args.vocab_padded, args.seq, args.layers, args.heads, args.embd).to(device)
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    opt, fused = make_optimizer(model, device)
    autocast = not args.no_autocast

    def step(fn, b):
        x = torch.randint(0, args.vocab, (b, args.seq), device=device)
        y = torch.randint(0, args.vocab, (b, args.seq), device=device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = fn(x, y)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    batch = args.batch
    if batch <= 0:
        b, batch = 8, 0
        while b <= args.max_batch:
            try:
                step(model, b)
                sync()
                batch = b
                log(f"micro-batch {b} fits")
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                log(f"micro-batch {b}: out of memory, stopping the search")
                opt.zero_grad(set_to_none=True)
                break
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            b *= 2
        if batch == 0:
            sys.exit("gpu_bench: even micro-batch 8 does not fit")

    compiled = not args.no_compile and hasattr(torch, "compile")
    fn = torch.compile(model) if compiled else model
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    log(f"micro-batch {batch}, seq {args.seq}, {n_params / 1e6:.1f}M parameters, "
        f"compile {compiled}, fused AdamW {fused}; {args.warmup} warm-up steps")
    t_compile = time.perf_counter()
    for _ in range(args.warmup):
        step(fn, batch)
    sync()
    warmup_s = time.perf_counter() - t_compile

    times, loss = [], None
    for _ in range(args.steps):
        t = time.perf_counter()
        loss = step(fn, batch)
        sync()
        times.append(time.perf_counter() - t)

    tokens = batch * args.seq
    q = args.embd // args.heads
    flops_per_token = 6 * n_params + 12 * args.layers * args.heads * q * args.seq
    med = statistics.median(times)
    mean = sum(times) / len(times)
    tps = tokens / med
    result = {
        "impl": "pytorch",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": f"gpt2 L{args.layers} H{args.heads} C{args.embd}",
        "params": n_params,
        "layers": args.layers, "heads": args.heads, "embd": args.embd, "seq": args.seq,
        "vocab": args.vocab, "vocab_padded": args.vocab_padded,
        "micro_batch": batch, "tokens_per_step": tokens,
        "dtype": "bf16-autocast" if autocast else "fp32",
        "compile": compiled, "fused_adamw": fused, "sdpa": hasattr(F, "scaled_dot_product_attention"),
        "warmup_steps": args.warmup, "warmup_s": round(warmup_s, 3), "timed_steps": args.steps,
        "step_ms_median": round(med * 1e3, 3), "step_ms_mean": round(mean * 1e3, 3),
        "step_ms_min": round(min(times) * 1e3, 3), "step_ms_max": round(max(times) * 1e3, 3),
        "tokens_per_s": round(tps, 1), "tokens_per_s_mean": round(tokens / mean, 1),
        "flops_per_token": flops_per_token,
        "flops_formula": "6*N + 12*L*H*Q*T",
        "peak_flops": args.peak_flops,
        "mfu": round(flops_per_token * tps / args.peak_flops, 4),
        "final_loss": round(float(loss), 4),
    }
    if device.type == "cuda":
        result["max_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
