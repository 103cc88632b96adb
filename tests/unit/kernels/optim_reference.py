"""References for tests/unit/kernels/optim_test.cc: torch.optim.SGD and torch.optim.Adagrad, and
Lion's formula (lion-pytorch / DeepSpeed FusedLion) in torch ops, 10 steps on random fp32 tensors
with gradients that change every step. Writes OUT (JSON): per case the optimizer and its
parameters, the initial weights, the gradients of every step, and the weights and state after the
last step. Run with Debian's /usr/bin/python3 (python3-torch)."""
import json
import sys

import torch

N, STEPS = 1031, 10  # not a multiple of any vector width


def lion(p, m, g, lr, betas, wd):  # the reference formula, in torch ops
    p.mul_(1 - lr * wd)
    update = m.clone().mul_(betas[0]).add(g, alpha=1 - betas[0]).sign_()
    p.add_(update, alpha=-lr)
    m.mul_(betas[1]).add_(g, alpha=1 - betas[1])


CASES = [
    ("SGD", {"lr": 0.05, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.02}),
    ("Adagrad", {"lr": 0.05, "lr_decay": 0.01, "weight_decay": 0.01,
                 "initial_accumulator_value": 0.1, "eps": 1e-10}),
    ("Adagrad", {"lr": 0.01, "weight_decay": 0.05}),
    ("Lion", {"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.1}),
    ("Lion", {"lr": 3e-4, "betas": [0.95, 0.98], "weight_decay": 1.0}),
]


def main():
    torch.manual_seed(1234)
    out = []
    for kind, params in CASES:
        p = torch.randn(N, dtype=torch.float32)
        p0 = p.clone()
        grads = [torch.randn(N, dtype=torch.float32) * (0.5 + 0.25 * s) for s in range(STEPS)]
        for g in grads:  # some exact zeros (sign 0, no SGD movement without decay)
            g[::97] = 0.0
        p = torch.nn.Parameter(p)
        m = torch.zeros(N, dtype=torch.float32)
        if kind == "Lion":
            for g in grads:
                with torch.no_grad():
                    lion(p.data, m, g, params["lr"], params["betas"], params["weight_decay"])
            state = {"m": m}
        else:
            opt = getattr(torch.optim, kind)([p], **params)
            for g in grads:
                p.grad = g.clone()
                opt.step()
            st = opt.state[p]
            state = {"m": st["momentum_buffer"]} if kind == "SGD" and params.get("momentum") \
                else {"v": st["sum"]} if kind == "Adagrad" else {}
        out.append({"type": kind, "params": params, "p0": p0.tolist(),
                    "grads": [g.tolist() for g in grads], "p": p.detach().tolist(),
                    **{k: t.tolist() for k, t in state.items()}})
    with open(sys.argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "cases": out}, f)


if __name__ == "__main__":
    main()
