"""Reference for tests/unit/kernels/muon_test.cc: torch.optim.Muon's step (torch >= 2.9,
torch/optim/_muon.py) written out in torch ops, since Debian's torch 1.13 has no Muon: the
momentum buffer lerp, the Nesterov blend, Newton-Schulz on the matrix (transposed when tall,
divided by its norm clamped to eps, the quintic iteration), the learning-rate adjustment by
shape and the decoupled weight decay. One change from _muon.py: Newton-Schulz runs in fp32
instead of bf16 (zerod's choice). 10 steps on random fp32 matrices (a wide, a tall, a square)
with gradients that change every step. Writes OUT (JSON): per case the parameters, the initial
weights, the gradients, and the weights, momentum buffer and last orthogonalised update after the
last step; the same 10 steps in float64 from the same inputs ("p64", "ortho64": the formula's
exact value to fp32's resolution, against which fp32 rounding, torch's and zerod's, is measured). Run with Debian's /usr/bin/python3 (python3-torch)."""
import json
import math
import sys

import torch

STEPS = 10


def newton_schulz(grad, coeffs, steps, eps):  # _zeropower_via_newtonschulz, fp32
    a, b, c = coeffs
    x = grad.clone()
    if grad.size(0) > grad.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        gram_update = b * gram + c * gram @ gram
        x = a * x + gram_update @ x
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


def adjust_lr(lr, fn, shape):  # _adjust_lr
    A, B = shape[:2]
    if fn is None or fn == "original":
        return lr * math.sqrt(max(1, A / B))
    return lr * 0.2 * math.sqrt(max(A, B))


def muon_step(p, buf, grad, q):  # _single_tensor_muon, one parameter
    buf.lerp_(grad, 1 - q["momentum"])
    update = grad.lerp(buf, q["momentum"]) if q["nesterov"] else buf
    update = newton_schulz(update, q["ns_coefficients"], q["ns_steps"], q["eps"])
    adjusted = adjust_lr(q["lr"], q["adjust_lr_fn"], p.shape)
    p.mul_(1 - q["lr"] * q["weight_decay"])
    p.add_(update, alpha=-adjusted)
    return update


BASE = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
        "ns_coefficients": [3.4445, -4.775, 2.0315], "eps": 1e-7, "ns_steps": 5,
        "adjust_lr_fn": None}
CASES = [
    ((24, 40), {}),                                   # wide
    ((48, 20), {}),                                   # tall: transposed
    ((32, 32), {"nesterov": False, "weight_decay": 0.0}),
    ((40, 24), {"adjust_lr_fn": "match_rms_adamw", "momentum": 0.9}),
    ((17, 33), {"ns_steps": 3, "ns_coefficients": [2.0, -1.5, 0.5], "lr": 0.1}),
    ((24, 40), {"ns_steps": 0}),                      # the elementwise steps and the norm alone
    ((48, 20), {"ns_steps": 0, "nesterov": False, "adjust_lr_fn": "match_rms_adamw"}),
]


def main():
    torch.manual_seed(4321)
    out = []
    for shape, extra in CASES:
        q = dict(BASE, **extra)
        p = torch.randn(*shape, dtype=torch.float32) * 0.1
        p0 = p.clone()
        grads = [torch.randn(*shape, dtype=torch.float32) * (0.5 + 0.25 * s) for s in range(STEPS)]
        buf = torch.zeros_like(p)
        last = None
        for g in grads:
            last = muon_step(p, buf, g, q)
        p64, buf64, last64 = p0.double(), torch.zeros_like(p0, dtype=torch.float64), None
        for g in grads:
            last64 = muon_step(p64, buf64, g.double(), q)
        out.append({"p64": p64.flatten().tolist(), "ortho64": last64.flatten().tolist(),"shape": list(shape), "params": q, "p0": p0.flatten().tolist(),
                    "grads": [g.flatten().tolist() for g in grads], "p": p.flatten().tolist(),
                    "m": buf.flatten().tolist(), "ortho": last.flatten().tolist()})
    with open(sys.argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "cases": out}, f)


if __name__ == "__main__":
    main()
