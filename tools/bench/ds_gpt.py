"""CPU training benchmark, DeepSpeed side: tools/bench/torch_gpt.py's GPT-2 (the same shape,
fp32, torch.optim.AdamW, gradient clipping 1.0, random tokens) trained by DeepSpeed's engine
on its CPU accelerator at a ZeRO stage, one process per rank, launched by torchrun over Gloo.

  DS_ACCELERATOR=cpu torchrun --nproc-per-node W tools/bench/ds_gpt.py --stage S --json \
      [--steps N] [--warmup N] [shape flags as torch_gpt.py]

Rank 0 prints the median step time over the measured steps and the job's tokens/s (all ranks'
micro-batches: W x batch x seq tokens per step). Run from the venv tools/bench/train_bench.sh
makes (PyPI torch and deepspeed).
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT, shape_args  # noqa: E402

import deepspeed  # noqa: E402


def main():
    ap = shape_args()
    ap.add_argument("--stage", type=int, default=0)
    a, _ = ap.parse_known_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = GPT(a.layers, a.heads, a.embd, a.vocab, a.seq)
    if a.stage == 3:
        # The tied head reads wte.weight outside wte's forward: ZeRO-3 must gather it there too.
        deepspeed.zero.register_external_parameter(model, model.wte.weight)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    config = {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": a.stage},
        "steps_per_print": 1_000_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    gen = torch.Generator().manual_seed(1 + rank)
    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
        y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
        t0 = time.perf_counter()
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    if rank == 0:
        result = {"tokens_per_s": round(world * a.batch * a.seq / median, 1), "step_ms": round(median * 1e3, 1),
                  "min_step_ms": round(min(times) * 1e3, 1), "max_step_ms": round(max(times) * 1e3, 1),
                  "steps": len(times), "world": world, "stage": a.stage, "threads": torch.get_num_threads(),
                  "torch": torch.__version__, "deepspeed": deepspeed.__version__, "loss": loss.item()}
        print(json.dumps(result) if a.json else result, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
