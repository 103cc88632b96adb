"""Parity of zerod's Llama-family models with Hugging Face transformers (CPU, fp32).

For each small configuration (GQA, untied and tied embeddings, q/k/v and MLP biases, Mistral's
sliding window shorter than the sequence, Llama 3, linear, YaRN and dynamic NTK rope scaling,
an explicit head_dim), a randomly initialised *ForCausalLM is saved with save_pretrained; zerod_hf_probe
loads that directory, runs forward and backward on the same tokens and writes its loss, logits
and every parameter's gradient, which must equal transformers' within the tolerances below.

  python parity.py PROBE_BINARY WORKDIR
"""
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

LOGITS_TOL = 1e-5  # max |diff| / max |logit|
LOSS_TOL = 1e-5    # relative
GRAD_TOL = 1e-4    # max |diff| / max |grad| per tensor
BF16_LOSS_TOL = 1e-2  # zerod's bf16 emulation against transformers in bfloat16 (as the bf16
                      # parity tests between ZeRO stages use)

B, T = 2, 16

CASES = {
    "llama_gqa_untied": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False)),
    "llama3_rope_tied_mqa": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, vocab_size=256, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
    "llama_biases_linear_rope_head_dim": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=200, attention_bias=True, mlp_bias=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0})),
    # YaRN: the ramp spans channels 0-5 of 8 (theta 100, 64 pretraining positions), the
    # attention factor is 0.1 ln 4 + 1.
    "llama_yarn": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, rope_theta=100.0, max_position_embeddings=64,
        rope_scaling={"rope_type": "yarn", "factor": 4.0})),
    "qwen2_yarn_betas_attention_factor": (Qwen2Config, Qwen2ForCausalLM, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, rope_theta=50.0, max_position_embeddings=32,
        rope_scaling={"type": "yarn", "factor": 3.0, "beta_fast": 8.0, "beta_slow": 2.0,
                      "attention_factor": 1.3})),
    # Dynamic NTK: T = 16 is past max_position_embeddings 8, so the base grows.
    "llama_dynamic": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, max_position_embeddings=8,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    "mistral_window": (MistralConfig, MistralForCausalLM, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, sliding_window=5)),
    "qwen2_bias_tied": (Qwen2Config, Qwen2ForCausalLM, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True)),
    # Qwen2's per-layer window as transformers 4.57 has it: with use_sliding_window the layers
    # from max_window_layers on, or those layer_types names, are windowed (layer 0 here, then
    # layer 1 of 3). transformers 4.46's eager attention windows every layer, so the layers that
    # 4.57 leaves full get a plain causal mask here (FULL_LAYERS).
    "qwen2_window_from_max_window_layers": (Qwen2Config, Qwen2ForCausalLM, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, use_sliding_window=True, sliding_window=5,
        max_window_layers=1)),
    "qwen2_window_from_layer_types": (Qwen2Config, Qwen2ForCausalLM, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, use_sliding_window=True, sliding_window=4,
        max_window_layers=2,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
}
FULL_LAYERS = {"qwen2_window_from_max_window_layers": [0],
               "qwen2_window_from_layer_types": [1]}


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def causal_only(layer):
    """Makes a decoder layer attend causally to every position, whatever mask it is given."""
    forward = layer.forward

    def patched(*args, attention_mask=None, **kwargs):
        if attention_mask is not None:
            Tq, Tk = attention_mask.shape[-2:]  # transformers 4.46 gives one more key column
            future = torch.ones(Tq, Tk, dtype=torch.bool).triu(1)
            attention_mask = torch.zeros_like(attention_mask).masked_fill(
                future, torch.finfo(attention_mask.dtype).min)
        return forward(*args, attention_mask=attention_mask, **kwargs)
    layer.forward = patched


def check_case(name, cfg_cls, model_cls, kw, probe, workdir):
    torch.manual_seed(1234)
    config = cfg_cls(attn_implementation="eager", **kw)
    model = model_cls(config).float()
    for l in FULL_LAYERS.get(name, []):
        causal_only(model.model.layers[l])
    with torch.no_grad():  # every parameter random, norms around 1, biases non-zero
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    d = os.path.join(workdir, name)
    model.save_pretrained(d, safe_serialization=True)
    rows = torch.randint(0, config.vocab_size, (B, T + 1), dtype=torch.int32)
    tokens = os.path.join(workdir, name + ".tokens")
    rows.numpy().tofile(tokens)
    out = os.path.join(workdir, name + ".out.safetensors")
    subprocess.run([probe, "--from", d, "--tokens", tokens, "--batch", str(B), "--seq", str(T),
                    "--out", out], check=True)
    got = load_file(out)

    inputs, targets = rows[:, :T].long(), rows[:, 1:].long()
    model.zero_grad()
    logits = model(input_ids=inputs).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()

    failures = []
    e = rel(got["logits"], logits.detach())
    if e > LOGITS_TOL:
        failures.append(f"logits: {e:.3g} > {LOGITS_TOL}")
    e = abs(got["loss"].item() - loss.item()) / abs(loss.item())
    if e > LOSS_TOL:
        failures.append(f"loss: {got['loss'].item()} vs {loss.item()} ({e:.3g})")
    worst = 0.0
    params = dict(model.named_parameters())
    if config.tie_word_embeddings:
        params.pop("lm_head.weight", None)
    for pname, p in params.items():
        key = "grad." + pname
        if key not in got:
            failures.append(f"{pname}: no gradient from zerod")
            continue
        e = rel(got[key], p.grad)
        worst = max(worst, e)
        if e > GRAD_TOL:
            failures.append(f"grad {pname}: {e:.3g} > {GRAD_TOL}")
    extra = set(k[5:] for k in got if k.startswith("grad.")) - set(params)
    if extra:
        failures.append(f"zerod has tensors transformers does not: {sorted(extra)}")
    # bf16: zerod's emulated bf16 against transformers running the model in bfloat16.
    out16 = os.path.join(workdir, name + ".bf16.safetensors")
    subprocess.run([probe, "--from", d, "--tokens", tokens, "--batch", str(B), "--seq", str(T),
                    "--out", out16, "--dtype", "bf16"], check=True, capture_output=True)
    with torch.no_grad():
        logits16 = model.to(torch.bfloat16)(input_ids=inputs).logits.float()
    loss16 = F.cross_entropy(logits16.reshape(-1, logits16.shape[-1]), targets.reshape(-1)).item()
    got16 = load_file(out16)["loss"].item()
    e16 = abs(got16 - loss16) / abs(loss16)
    if e16 > BF16_LOSS_TOL:
        failures.append(f"bf16 loss: {got16} vs {loss16} ({e16:.3g} > {BF16_LOSS_TOL})")
    status = "ok" if not failures else "FAIL"
    print(f"{name}: {status} (loss {loss.item():.6f}, worst gradient rel. error {worst:.2e}; "
          f"bf16 loss {got16:.5f} vs transformers bf16 {loss16:.5f})")
    for f in failures:
        print("   ", f)
    return not failures


def main():
    probe, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    torch.set_num_threads(1)
    ok = True
    for name, (cfg_cls, model_cls, kw) in CASES.items():
        ok = check_case(name, cfg_cls, model_cls, kw, probe, workdir) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
