#!/usr/bin/env python3
"""CPU training benchmark, PyTorch side of `zerod_train_bench --model llama`: Hugging Face
transformers' LlamaForCausalLM of the same shape (4 layers, hidden 256, 4 heads / 2 KV heads,
SwiGLU 688, vocabulary 32000, untied lm_head, RMSNorm eps 1e-6, RoPE theta 10000), eager
attention, random init, random tokens, fp32, torch.optim.AdamW (weight decay on the 2-D weights,
as zerod), gradient clipping at 1.0. Tokens/s are measured as torch_gpt.py measures them: the
median step (zero_grad, forward, loss, backward, clip, optimizer step) after --warmup steps.

When the torch in use has torch.compile (2.0 and later), the same model is also measured
compiled; Debian 12's torch 1.13 has not, and then the result says so (no compiled number).

transformers is not in Debian's python: tools/bench/train_bench.sh --model llama runs this in a
venv over Debian's python3-torch (build/bench-venv), e.g.
  build/bench-venv/bin/python tools/bench/torch_llama.py --json
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402


def build(a):
    cfg = LlamaConfig(
        hidden_size=a.embd,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        vocab_size=a.vocab,
        max_position_embeddings=a.seq,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        use_cache=False,  # training: no KV cache
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float()
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))
    return model, opt


def measure(a, model, forward, opt):
    """Median step seconds over a.steps steps after a.warmup, and the last loss."""
    gen = torch.Generator().manual_seed(1)
    times = []
    loss = None
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
        y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = forward(input_ids=x).logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), float(loss)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile measurement")
    ap.add_argument("--json", action="store_true")
    a, _ = ap.parse_known_args()  # zerod-only flags (e.g. --model, --dtype) are ignored
    torch.set_num_threads(a.threads)

    model, opt = build(a)
    n_params = sum(p.numel() for p in model.parameters())
    median, loss = measure(a, model, model, opt)
    tps = a.batch * a.seq / median
    result = {"tokens_per_s": round(tps, 1), "step_ms": round(median * 1e3, 1),
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "transformers": transformers.__version__, "model": "LlamaForCausalLM eager",
              "parameters": n_params, "loss": loss}

    compiled_tps = None
    if a.no_compile:
        note = "skipped (--no-compile)"
    elif not hasattr(torch, "compile"):
        note = f"not available with torch {torch.__version__} (no torch.compile)"
    else:
        try:
            model_c, opt_c = build(a)
            median_c, _ = measure(a, model_c, torch.compile(model_c), opt_c)
            compiled_tps = round(a.batch * a.seq / median_c, 1)
            note = "torch.compile (default mode); compilation falls in the warm-up steps"
        except Exception as e:  # report, do not fake a number
            note = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    result["compiled_tokens_per_s"] = compiled_tps
    result["compiled_note"] = note

    if a.json:
        print(json.dumps(result))
    else:
        print(f"pytorch {torch.__version__}, transformers {transformers.__version__}, LlamaForCausalLM "
              f"(eager, {n_params / 1e6:.2f}M parameters): {tps:.0f} tokens/s (median step "
              f"{median * 1e3:.1f} ms, {torch.get_num_threads()} threads)")
        if compiled_tps is not None:
            print(f"compiled: {compiled_tps:.0f} tokens/s")
        else:
            print(f"compiled baseline: {note}")


if __name__ == "__main__":
    main()
