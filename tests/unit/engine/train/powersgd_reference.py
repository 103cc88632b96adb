"""Reference for tests/unit/engine/train/powersgd_test.cc: PowerSGD (Vogels et al. 2019) as
PyTorch's DDP hook computes it (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py),
in torch ops with the hook's own _orthogonalize_gram_schmidt, over every rank's gradients at
once. Reads IN (JSON: world, start_iter, epsilon, the compressed matrices with their initial Q,
the uncompressed tensors, every step's gradients of every rank); writes OUT (JSON): every step's
reduced gradients of every rank (sums over ranks, as zerod's reducer gives them) and each rank's
final error-feedback residuals. Run with Debian's /usr/bin/python3 (python3-torch)."""
import json
import sys

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import \
    _orthogonalize_gram_schmidt


def orthogonalize(a, eps):
    _orthogonalize_gram_schmidt(a.unsqueeze(0), epsilon=eps)  # in place on the view


def main():
    with open(sys.argv[1]) as f:
        inp = json.load(f)
    world, start, eps = inp["world"], inp["start_iter"], inp["epsilon"]
    mats, plain = inp["matrices"], inp["plain"]
    errors = [[torch.zeros(m["rows"], m["cols"]) for m in mats] for _ in range(world)]
    qs = [None] * len(mats)
    out = []
    for step, grads in enumerate(inp["grads"]):
        gs = [torch.tensor(g, dtype=torch.float32) for g in grads]
        if step < start:  # plain all-reduce of the whole buffer
            total = torch.stack(gs).sum(0)
            out.append([total.tolist() for _ in range(world)])
            continue
        res = [g.clone() for g in gs]
        for t in plain:
            a, n = t["at"], t["numel"]
            s = torch.stack([g[a:a + n] for g in gs]).sum(0)
            for r in range(world):
                res[r][a:a + n] = s
        for i, m in enumerate(mats):
            a, rows, cols, rk = m["at"], m["rows"], m["cols"], m["r"]
            ms = [gs[r][a:a + rows * cols].view(rows, cols) + errors[r][i] for r in range(world)]
            if qs[i] is None:
                qs[i] = torch.tensor(m["q0"], dtype=torch.float32).view(cols, rk)
            q = qs[i]
            orthogonalize(q, eps)
            p = torch.stack([mm @ q for mm in ms]).sum(0)
            orthogonalize(p, eps)
            q = torch.stack([mm.t() @ p for mm in ms]).sum(0) / world
            approx = p @ q.t()
            for r in range(world):
                errors[r][i] = ms[r] - approx
                res[r][a:a + rows * cols] = (approx * world).flatten()
            qs[i] = q
        out.append([x.tolist() for x in res])
    err = [torch.cat([e.flatten() for e in errs]).tolist() if errs else [] for errs in errors]
    with open(sys.argv[2], "w") as f:
        json.dump({"reduced": out, "errors": err}, f)


if __name__ == "__main__":
    main()
