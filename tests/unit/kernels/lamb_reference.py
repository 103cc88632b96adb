"""Reference for tests/unit/kernels/lamb_test.cc: DeepSpeed FusedLamb's update
(csrc/lamb/fused_lamb_cuda_kernel.cu, parts 1-3) written in torch fp32 ops, 10 steps on several
tensors of different sizes and scales, with gradients that change every step and weight decay on.
The scales make the trust ratio hit max_coeff (weights x100), min_coeff (weights x1e-3), a zero
weight norm (a tensor starting at 0) and zero norms of both (no weights, no gradients). The norms
are summed in float64 (zerod sums its partial sums in double; DeepSpeed's fp32 block tree has an
order of its own). Writes OUT (JSON): per case the parameters, per tensor the initial weights, the
gradients of every step, the weights, exp_avg and exp_avg_sq after the last step, and the trust
ratio of every step. Run with Debian's /usr/bin/python3 (python3-torch)."""
import json
import sys

import torch

STEPS = 10
# (name, elements, weight scale, gradients zero)
TENSORS = [("normal", 1031, 1.0, False), ("big", 300, 100.0, False),
           ("tiny", 4099, 1e-3, False), ("zero", 64, 0.0, False), ("vector", 7, 1.0, False),
           ("dead", 16, 0.0, True)]
CASES = [
    {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "eps_inside_sqrt": False,
     "weight_decay": 0.01, "bias_correction": True, "max_coeff": 10.0, "min_coeff": 0.01},
    {"lr": 5e-3, "betas": [0.8, 0.99], "eps": 1e-6, "eps_inside_sqrt": True,
     "weight_decay": 0.1, "bias_correction": False, "max_coeff": 2.0, "min_coeff": 0.05},
]


def f32(x):
    return torch.tensor(x, dtype=torch.float32)


def lamb_step(p, m, v, g, step, c):
    """One FusedLamb step of one tensor, in place; returns the trust ratio."""
    b1, b2, eps, wd, lr = (f32(c["betas"][0]), f32(c["betas"][1]), f32(c["eps"]),
                           f32(c["weight_decay"]), f32(c["lr"]))
    if c["bias_correction"]:  # host code: the powers in double, then fp32
        bc1 = f32(1.0 - float(b1) ** step)
        bc2 = f32(1.0 - float(b2) ** step)
        step_size = lr * torch.sqrt(bc2) / bc1
    else:
        step_size = lr
    one = f32(1.0)

    def direction():
        denom = torch.sqrt(v + eps) if c["eps_inside_sqrt"] else torch.sqrt(v) + eps
        return m / denom + wd * p

    # part 1: moments, and the norms of the weights and of the update direction
    m.copy_(b1 * m + (one - b1) * g)
    v.copy_(b2 * v + (one - b2) * g * g)
    w_norm = p.double().pow(2).sum().sqrt().item()
    u_norm = direction().double().pow(2).sum().sqrt().item()
    # part 3: the clamped ratio, the step with u recomputed
    coeff = f32(1.0)
    if w_norm != 0 and u_norm != 0:
        coeff = f32(w_norm / u_norm)
        coeff = torch.minimum(coeff, f32(c["max_coeff"]))
        coeff = torch.maximum(coeff, f32(c["min_coeff"]))
    p.copy_(p - (step_size * coeff) * direction())
    return coeff.item()


def main():
    torch.manual_seed(4321)
    out = []
    for c in CASES:
        tensors = []
        for name, n, scale, dead in TENSORS:
            p = torch.randn(n, dtype=torch.float32) * scale
            grads = [torch.randn(n, dtype=torch.float32) * (0.5 + 0.25 * s) for s in range(STEPS)]
            if dead:
                grads = [torch.zeros(n, dtype=torch.float32) for _ in range(STEPS)]
            p0 = p.clone()
            m = torch.zeros(n, dtype=torch.float32)
            v = torch.zeros(n, dtype=torch.float32)
            coeffs = [lamb_step(p, m, v, g, s + 1, c) for s, g in enumerate(grads)]
            tensors.append({"name": name, "p0": p0.tolist(), "grads": [g.tolist() for g in grads],
                            "p": p.tolist(), "m": m.tolist(), "v": v.tolist(),
                            "coeffs": coeffs})
        out.append({"params": c, "tensors": tensors})
    with open(sys.argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "cases": out}, f)


if __name__ == "__main__":
    main()
