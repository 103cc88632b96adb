"""Training parity: 20 steps of `zerod train` on a Hugging Face Llama directory (init_from)
against a PyTorch loop over transformers' LlamaForCausalLM on the same weights and batches
(AdamW with decay on 2-D weights, gradient clipping at 1.0, gradient accumulation), at
ZeRO stage 0 on one rank, stage 3 on two ranks, and stage 2 with the optimizer offloaded to the
CPU on two ranks. Per-step losses must agree within 1e-4 relative.

The stage-3 run also saves its last step; then `zerod eval --from CKPT_DIR` must give the
reference model's validation loss, `zeroctl export CKPT_DIR --out DIR --max-shard-size 40KB`
must write a sharded directory that transformers' from_pretrained loads with the reference
model's logits, and `zerod generate` must give the same tokens from the checkpoint and from the
exported directory.

  python train_parity.py ZEROD_BINARY ZEROCTL_BINARY WORKDIR
"""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

STEPS, T, GLOBAL_BATCH, MICRO = 20, 16, 4, 2
LR, BETAS, EPS, WD, CLIP = 5e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
TOL = 1e-4


def write_shard(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def reference_losses(model_dir, tokens):
    model = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="eager").float()
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    t = torch.tensor(tokens, dtype=torch.long)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        rows = [t[k * T:k * T + T + 1] for k in range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)]
        batch = torch.stack(rows)
        logits = model(input_ids=batch[:, :T]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    return losses, model


def zerod_losses(zerod, workdir, name, model_dir, shard, nproc, zero, val=None, ckpt=None):
    out = os.path.join(workdir, "runs")
    job = {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                  "weight_decay": WD}},
        "gradient_clipping": CLIP,
        "zero_optimization": zero,
        "csv_monitor": {"enabled": True, "output_path": out, "job_name": name},
        "model": {"init_from": model_dir, "seq_len": T},
        "data": {"train": shard, "shuffle": False},
        "train": {"steps": STEPS},
    }
    if val:
        job["data"]["val"] = val
    if ckpt:
        job["train"].update({"checkpoint_dir": ckpt, "save_interval": STEPS})
    path = os.path.join(workdir, name + ".json")
    with open(path, "w") as f:
        json.dump(job, f)
    subprocess.run([zerod, "--log-level", "warn", "train", path, "--nproc-per-node", str(nproc)],
                   check=True)
    with open(os.path.join(out, name, "metrics.csv")) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)], path


def check_saved_model(zerod, zeroctl, workdir, job, ckpt, ref_model, val_tokens):
    ok = True
    ref_model.eval()
    v = torch.tensor(val_tokens, dtype=torch.long)
    rows = torch.stack([v[k * T:k * T + T + 1] for k in range(6)])
    with torch.no_grad():
        ref_logits = ref_model(input_ids=rows[:, :T]).logits
        ref_val = F.cross_entropy(ref_logits.reshape(-1, ref_logits.shape[-1]),
                                  rows[:, 1:].reshape(-1)).item()
    r = subprocess.run([zerod, "--log-level", "warn", "eval", job, "--from", ckpt],
                       capture_output=True, text=True, check=True)
    got_val = float(r.stdout.split("val loss ")[1].split()[0])
    good = abs(got_val - ref_val) / ref_val <= TOL
    ok = ok and good
    print(f"zerod eval --from checkpoint: {'ok' if good else 'FAIL'} (val loss {got_val:.6f}, "
          f"transformers {ref_val:.6f})")

    out = os.path.join(workdir, "exported")
    subprocess.run([zeroctl, "export", ckpt, "--out", out, "--max-shard-size", "40KB"],
                   check=True, capture_output=True)
    shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    exported = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").float()
    with torch.no_grad():
        logits = exported(input_ids=rows[:, :T]).logits
    err = ((logits - ref_logits).abs().max() / ref_logits.abs().max()).item()
    good = len(shards) > 1 and os.path.exists(os.path.join(out, "model.safetensors.index.json")) \
        and err <= TOL
    ok = ok and good
    print(f"zeroctl export -> from_pretrained: {'ok' if good else 'FAIL'} ({len(shards)} shards, "
          f"logits {err:.2e} from the PyTorch-trained model)")

    def gen(source):
        return subprocess.run([zerod, "--log-level", "warn", "generate", "--from", source,
                               "--prompt-tokens", "5,12,19", "--max-new-tokens", "12"],
                              capture_output=True, text=True, check=True).stdout
    a, b = gen(ckpt), gen(out)
    good = a == b and len(a.split()) == 12
    ok = ok and good
    print(f"zerod generate from the checkpoint and from the export: {'ok' if good else 'FAIL'} "
          f"({a.strip()})")
    return ok


def main():
    zerod, zeroctl, workdir = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(workdir, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(7)
    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                         tie_word_embeddings=False, attn_implementation="eager")
    model = LlamaForCausalLM(config)
    model_dir = os.path.join(workdir, "llama")
    model.save_pretrained(model_dir, safe_serialization=True)
    n = (STEPS * GLOBAL_BATCH + 3) * T + 1
    # Tokens with structure to learn (a noisy counter), so the loss moves.
    rng = np.random.default_rng(3)
    tokens = [(i * 7 + int(rng.integers(0, 2))) % 300 for i in range(n)]
    shard = os.path.join(workdir, "train_000000.bin")
    write_shard(shard, tokens)

    val_tokens = [(i * 7 + int(rng.integers(0, 2))) % 300 for i in range(6 * T + 1)]
    val_shard = os.path.join(workdir, "val_000000.bin")
    write_shard(val_shard, val_tokens)
    ckpt = os.path.join(workdir, "ckpt")

    ref, ref_model = reference_losses(model_dir, tokens)
    runs = {
        "stage0_world1": (1, {"stage": 0}),
        "stage3_world2": (2, {"stage": 3}),
        "stage2_offload_cpu_world2": (2, {"stage": 2, "offload_optimizer": {"device": "cpu"}}),
    }
    ok = True
    print("transformers:", " ".join(f"{x:.5f}" for x in ref))
    stage3_job = None
    for name, (nproc, zero) in runs.items():
        stage3 = name == "stage3_world2"
        got, job_path = zerod_losses(zerod, workdir, name, model_dir, shard, nproc, zero,
                                     val_shard if stage3 else None, ckpt if stage3 else None)
        if stage3:
            stage3_job = job_path
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref)) if len(got) == len(ref) else 1
        good = len(got) == STEPS and worst <= TOL
        ok = ok and good
        print(f"{name}: {'ok' if good else 'FAIL'} ({len(got)} steps, worst relative loss "
              f"difference {worst:.2e}; first {got[0]:.5f}, last {got[-1]:.5f})")
    ok = check_saved_model(zerod, zeroctl, workdir, stage3_job, ckpt, ref_model, val_tokens) and ok
    tail = sum(ref[-5:]) / 5
    if tail > ref[0] - 0.15:  # the updates must matter, or equal losses prove little
        print(f"the reference loss barely moved ({ref[0]:.3f} -> {tail:.3f}): a weak test")
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
