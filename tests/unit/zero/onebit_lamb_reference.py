"""Reference for tests/unit/zero/onebit_lamb_test.cc: DeepSpeed's 1-bit LAMB
(deepspeed/runtime/fp16/onebit/lamb.py, OnebitLamb.step) in torch ops on one process, where
DeepSpeed skips the compressed all-reduce (size 1): the LAMB warm-up with lamb_coeff_freeze, then
at the freeze the scaling coefficients and the fresh variance, the frozen variance and the factor
with its clamps. Step numbering is zerod's: steps 1..freeze_step are LAMB steps (DeepSpeed's
extra first call that only initialises its buffers is left out).

Usage: onebit_lamb_reference.py IN OUT. IN (JSON): tensor sizes, decay flags, freeze_step,
steps and the hyperparameters. OUT (JSON): the initial weights, every step's gradients, and the
weights, exp_avg and the lamb coefficients after the last step. Debian's /usr/bin/python3
(python3-torch)."""
import json
import sys

import numpy as np
import torch


def main():
    cfg = json.load(open(sys.argv[1]))
    torch.manual_seed(cfg["seed"])
    sizes, decays = cfg["sizes"], cfg["decay"]
    lr, (beta1, beta2), eps = cfg["lr"], cfg["betas"], cfg["eps"]
    max_coeff, min_coeff, coeff_beta = cfg["max_coeff"], cfg["min_coeff"], cfg["coeff_beta"]
    factor_max, factor_min = cfg["factor_max"], cfg["factor_min"]
    factor_threshold = cfg["factor_threshold"]
    params = [torch.randn(n, dtype=torch.float32) * 0.5 for n in sizes]
    p0 = [p.clone() for p in params]
    wds = [cfg["weight_decay"] if d else 0.0 for d in decays]
    state = [{"exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n),
              "exp_avg_sq_fresh": torch.zeros(n), "lamb_coeff_freeze": 0.0, "last_factor": 1.0}
             for n in sizes]
    grads_out = []
    coeffs = []
    for step in range(1, cfg["steps"] + 1):
        grads = [torch.randn(n, dtype=torch.float32) * (0.5 + 0.1 * step) for n in sizes]
        grads_out.append([g.tolist() for g in grads])
        coeffs = []
        if step <= cfg["freeze_step"]:
            for p, g, st, wd in zip(params, grads, state, wds):
                exp_avg, exp_avg_sq = st["exp_avg"], st["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                if step == cfg["freeze_step"]:
                    st["exp_avg_sq_fresh"] = exp_avg_sq.detach().clone()
                weight_norm = p.pow(2).sum().sqrt()
                update = exp_avg / (exp_avg_sq.sqrt() + eps)
                if wd > 0.0:
                    update += wd * p
                update_norm = update.pow(2).sum().sqrt()
                lamb_coeff = 1.0
                if weight_norm != 0 and update_norm != 0:
                    lamb_coeff = min(max((weight_norm / update_norm).item(), min_coeff), max_coeff)
                if lamb_coeff != 1.0:
                    st["lamb_coeff_freeze"] = (coeff_beta * st["lamb_coeff_freeze"] +
                                               (1 - coeff_beta) * lamb_coeff)
                coeffs.append(lamb_coeff)
                p.add_(-lr * lamb_coeff * update)
            continue
        last = [st["exp_avg"].detach().clone() for st in state]
        if "scaling_coeff" not in state[0]:
            scales = [(torch.linalg.vector_norm(st["exp_avg"]) / np.sqrt(st["exp_avg"].numel())).item()
                      for st in state]
            united = sum(scales) / len(scales)
            for st, s in zip(state, scales):
                st["scaling_coeff"] = united / s
        for g, st in zip(grads, state):
            st["exp_avg"].mul_(beta1).add_(g, alpha=1 - beta1)
            st["exp_avg"].mul_(st["scaling_coeff"])
        # (the compressed all-reduce of exp_avg: not at world 1)
        for p, st, m_last, wd in zip(params, state, last, wds):
            exp_avg, exp_avg_sq, fresh = st["exp_avg"], st["exp_avg_sq"], st["exp_avg_sq_fresh"]
            exp_avg.div_(st["scaling_coeff"])
            grad_reconstruct = (exp_avg - m_last * beta1) / (1 - beta1)
            fresh.mul_(beta2).addcmul_(grad_reconstruct, grad_reconstruct, value=1 - beta2)
            denom = exp_avg_sq.sqrt() + eps
            update_prelim = exp_avg / denom
            update = update_prelim + wd * p if wd > 0.0 else update_prelim
            update_norm = update.pow(2).sum().sqrt()
            denom_real = fresh.sqrt() + eps
            factor = (denom / denom_real).max().item()
            if wd > 0.0:
                update_ratio = min(1.0, (update_prelim.pow(2).sum().sqrt() / update_norm).item())
                factor = factor * update_ratio + (1.0 - update_ratio)
            factor = min(max(factor, factor_min), factor_max)
            factor = min(factor, st["last_factor"] * (1.0 + factor_threshold))
            factor = max(factor, st["last_factor"] * (1.0 - factor_threshold))
            st["last_factor"] = factor
            lamb_coeff = st["lamb_coeff_freeze"] * factor
            coeffs.append(lamb_coeff)
            p.add_(-lr * lamb_coeff * update)
    json.dump({"p0": [p.tolist() for p in p0], "grads": grads_out,
               "p": [p.tolist() for p in params], "m": [st["exp_avg"].tolist() for st in state],
               "coeff_freeze": [st["lamb_coeff_freeze"] for st in state],
               "last_coeffs": coeffs}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
