"""`zerod generate` against transformers' generate(do_sample=False): greedy output token for
token on small Llama, Mistral (window shorter than prompt + output), Qwen2 (also with YaRN) and
GPT-2 models saved with save_pretrained; sampling reproducible by seed; a prompt beyond a GPT-2 model's
positions refused with exit 2.

  python generate_parity.py ZEROD_BINARY WORKDIR
"""
import os
import subprocess
import sys

import torch
import transformers.generation.utils as generation_utils
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

# transformers 4.46's generate() asks torch.distributed.fsdp whether the model is FSDP-wrapped;
# importing that module fails on Debian's torch 1.13 under Python 3.11 (a dataclass error), and
# no model here is, so the question is answered directly.
generation_utils.is_fsdp_managed_module = lambda module: False

NEW = 24
CASES = {
    "llama": (LlamaForCausalLM, LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, rope_scaling={"rope_type": "llama3", "factor": 4.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
    "mistral": (MistralForCausalLM, MistralConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, vocab_size=300, sliding_window=6)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True)),
    # YaRN over 16 pretraining positions; the prompt and output run to 33.
    "qwen2_yarn": (Qwen2ForCausalLM, Qwen2Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, rope_theta=100.0, max_position_embeddings=16,
        rope_scaling={"rope_type": "yarn", "factor": 2.0})),
    "gpt2": (GPT2LMHeadModel, GPT2Config(
        n_layer=2, n_head=4, n_embd=64, vocab_size=300, n_positions=40, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0)),
}


def zerod_generate(zerod, d, prompt, *extra):
    r = subprocess.run([zerod, "--log-level", "warn", "generate", "--from", d, "--prompt-tokens",
                        ",".join(map(str, prompt)), *extra], capture_output=True, text=True)
    return r


def main():
    zerod, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    torch.manual_seed(11)
    ok = True
    for name, (cls, config) in CASES.items():
        config._attn_implementation = "eager"
        model = cls(config).eval()
        with torch.no_grad():  # sharper distributions than the init, so greedy paths vary
            for pname, p in model.named_parameters():
                if p.dim() >= 2:
                    p.mul_(8.0)
        d = os.path.join(workdir, name)
        model.save_pretrained(d, safe_serialization=True)
        prompt = torch.randint(0, config.vocab_size, (9,)).tolist()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                 min_new_tokens=NEW)
        want = out[0, len(prompt):].tolist()
        r = zerod_generate(zerod, d, prompt, "--max-new-tokens", str(NEW))
        got = [int(x) for x in r.stdout.split()] if r.returncode == 0 else None
        good = got == want
        ok = ok and good
        print(f"{name}: greedy {'ok' if good else 'FAIL'} ({len(want)} tokens, "
              f"{len(set(want))} distinct)")
        if not good:
            print("   transformers:", want)
            print("   zerod:       ", got, r.stderr[-500:])
    # Sampling: the same seed gives the same tokens, another seed other tokens.
    d = os.path.join(workdir, "llama")
    prompt = [1, 2, 3]
    sample = ["--max-new-tokens", "32", "--temperature", "1.5", "--top-k", "50", "--top-p", "0.95"]
    a = zerod_generate(zerod, d, prompt, *sample, "--seed", "5").stdout
    b = zerod_generate(zerod, d, prompt, *sample, "--seed", "5").stdout
    c = zerod_generate(zerod, d, prompt, *sample, "--seed", "6").stdout
    good = a == b and a != c and len(a.split()) == 32
    ok = ok and good
    print(f"sampling by seed: {'ok' if good else 'FAIL'}")
    # GPT-2 has 40 positions: 30 + 20 do not fit.
    r = zerod_generate(zerod, os.path.join(workdir, "gpt2"), list(range(30)), "--max-new-tokens",
                       "20")
    good = r.returncode == 2 and "40 (seq_len)" in r.stderr
    ok = ok and good
    print(f"prompt beyond the context: {'ok' if good else 'FAIL'} (exit {r.returncode}: "
          f"{r.stderr.strip()[-200:]})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
