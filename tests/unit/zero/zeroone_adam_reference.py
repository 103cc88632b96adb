"""Reference for tests/unit/zero/zeroone_adam_test.cc: DeepSpeed's 0/1 Adam
(deepspeed/runtime/fp16/onebit/zoadam.py, ZeroOneAdam.step) re-implemented in numpy float32 for
`world` simulated ranks, each with its own parameters, momentum, errors and momentum
accumulator, and the engine's enable_backward_allreduce flag it sets. The compressed all-reduce
is DeepSpeed's NcclBackend.compressed_allreduce (sign bits and one scale per rank with worker
error, server chunks averaged with server error, recompressed), in the element order of
comm/compressed_allreduce.cc. exp_avg_mask zeroes every element outside the live ranges.

DeepSpeed's first step() call only creates the buffers (its gradient is unused, nothing moves,
the step counter becomes 1): it is run here with no gradient, and zerod's step k is the call
k + 1. One stated deviation from zoadam.py: at world 1 a non-variance step still updates the
momentum from the (identity) all-reduce of the gradient, where DeepSpeed's `if self.size > 1`
skips it.

Usage: zeroone_adam_reference.py IN OUT. IN (JSON): world, steps, lr per step, betas, eps,
weight_decay, var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper, units
(n, live [[begin, end]...], decay [[begin, end, 0/1]...]), p0 per unit and grads[step][rank][unit]
(the gradients each rank computed). OUT (JSON): per step whether the gradients were all-reduced
and whether it synchronised; per rank and unit the final weights and momentum; per unit v."""
import json
import math
import sys

import numpy as np

f32 = np.float32


def padded(n, world):
    lcm = world * 8 // math.gcd(world, 8)
    unit = world * lcm
    return (n + unit - 1) // unit * unit


def scale(y):
    return f32(math.sqrt(float(np.sum(y.astype(np.float64) ** 2))) / math.sqrt(y.size))


def sign(y):
    return np.where(y < 0, f32(-1), f32(1)).astype(f32)


def compressed_allreduce(xs, worker, server):
    """xs[r]: rank r's tensor (n); worker[r] (P), server[r] (C) updated. Returns the average."""
    world, n = len(xs), xs[0].size
    P = worker[0].size
    C = P // world
    signs, scales = [], []
    for r in range(world):
        y = np.zeros(P, dtype=f32)
        y[:n] = xs[r]
        y = (y + worker[r]).astype(f32)
        s = scale(y)
        sg = sign(y)
        worker[r][:] = y - s * sg
        signs.append(sg)
        scales.append(s)
    out = np.zeros(P, dtype=f32)
    inv = f32(1.0) / f32(world)
    for c in range(world):
        z = np.zeros(C, dtype=f32)
        for q in range(world):
            z = (z + signs[q][c * C:(c + 1) * C] * f32(scales[q] * inv)).astype(f32)
        z = (z + server[c]).astype(f32)
        t = scale(z)
        sz = sign(z)
        server[c][:] = z - t * sz
        out[c * C:(c + 1) * C] = t * sz
    return out[:n]


def main():
    cfg = json.load(open(sys.argv[1]))
    world, steps = cfg["world"], cfg["steps"]
    beta1, beta2 = cfg["betas"]
    b1, omb1 = f32(beta1), f32(1 - beta1)
    b2, omb2 = f32(beta2), f32(1 - beta2)
    eps = f32(cfg["eps"])
    units = cfg["units"]
    masks, wds = [], []
    for u in units:
        mk = np.zeros(u["n"], dtype=f32)
        for b, e in u["live"]:
            mk[b:e] = 1
        masks.append(mk)
        wd = np.zeros(u["n"], dtype=f32)
        for b, e, d in u["decay"]:
            wd[b:e] = f32(cfg["weight_decay"]) if d else f32(0)
        wds.append(wd)
    # Per rank and unit: p, exp_avg, momentum_accumulator, worker_error; per unit: exp_avg_sq
    # (identical on every rank) and every server's error.
    p = [[np.array(cfg["p0"][k], dtype=f32) for k in range(len(units))] for _ in range(world)]
    m = [[np.zeros(u["n"], dtype=f32) for u in units] for _ in range(world)]
    acc = [[np.zeros(u["n"], dtype=f32) for u in units] for _ in range(world)]
    v = [np.zeros(u["n"], dtype=f32) for u in units]
    worker = [[np.zeros(padded(u["n"], world), dtype=f32) for _ in range(world)] for u in units]
    server = [[np.zeros(padded(u["n"], world) // world, dtype=f32) for _ in range(world)]
              for u in units]
    st = {"step": 0, "var_interval": 1, "var_counter": 0, "local_step_interval": 1,
          "local_step_counter": 0, "lrs": 0.0}
    freeze_key, reinitial = False, False
    allreduce = True  # the engine's enable_backward_allreduce
    initialize = False
    reduced, synced = [], []
    for call in range(steps + 1):
        st["step"] += 1
        if not initialize:
            # The first call: buffers only (the all-reduce of the zero accumulator leaves the
            # errors at 0). Then the freeze check below.
            initialize = True
        else:
            k = call - 1  # zerod's 0-based step index
            lr = cfg["lr"][k]
            lrf = f32(lr)
            g_all = cfg["grads"][k]
            reduced.append(allreduce)
            if allreduce:  # the engine averaged the gradients over the ranks
                grads = [[(sum(np.array(g_all[r][j], dtype=f32) for r in range(world))
                           * f32(1.0 / world)).astype(f32) for j in range(len(units))]
                         for _ in range(world)]
            else:
                grads = [[np.array(g_all[r][j], dtype=f32) for j in range(len(units))]
                         for r in range(world)]
            sync = freeze_key and st["step"] % st["local_step_interval"] == 0
            synced.append(sync)
            if freeze_key:
                st["lrs"] += lr
            for j in range(len(units)):
                if not freeze_key:
                    if st["step"] % st["var_interval"] == 0:
                        for r in range(world):
                            g = grads[r][j]
                            v_new = (v[j] * b2 + omb2 * g * g).astype(f32)
                            m[r][j] = (m[r][j] * b1 + omb1 * g).astype(f32)
                        v[j] = v_new
                    else:
                        xs = [grads[r][j] for r in range(world)]
                        g1 = compressed_allreduce(xs, worker[j], server[j]) if world > 1 else xs[0]
                        g1 = g1 * masks[j]
                        for r in range(world):
                            m[r][j] = (m[r][j] * b1 + omb1 * g1).astype(f32)
                else:
                    for r in range(world):
                        m[r][j] = (m[r][j] * b1 + omb1 * grads[r][j]).astype(f32)
                for r in range(world):
                    update = (m[r][j] / (np.sqrt(v[j]) + eps)).astype(f32)
                    update = np.where(wds[j] > 0, update + wds[j] * p[r][j], update).astype(f32)
                    step = (-lrf * update).astype(f32)
                    p[r][j] = (p[r][j] + step).astype(f32)
                    if freeze_key:
                        acc[r][j] = (acc[r][j] + step).astype(f32)
                if sync:
                    d = (np.sqrt(v[j]) + eps).astype(f32)
                    for r in range(world):
                        p[r][j] = (p[r][j] + -acc[r][j]).astype(f32)
                        acc[r][j] = (acc[r][j] * d).astype(f32)
                    xs = [acc[r][j] for r in range(world)]
                    avg = compressed_allreduce(xs, worker[j], server[j]) if world > 1 else xs[0]
                    avg = (avg * masks[j]).astype(f32)
                    for r in range(world):
                        m[r][j] = -(avg / f32(st["lrs"])).astype(f32)
                        p[r][j] = (p[r][j] + avg / d).astype(f32)
                        acc[r][j] = np.zeros_like(acc[r][j])
            if sync:
                st["lrs"] = 0.0
            if not freeze_key:
                if st["step"] % st["var_interval"] == 0:
                    st["var_counter"] += 1
                    if st["var_counter"] == cfg["var_update_scaler"]:
                        st["var_counter"] = 0
                        st["var_interval"] *= 2
                allreduce = (st["step"] + 1) % st["var_interval"] == 0
            else:
                st["local_step_counter"] += 1
                if st["local_step_counter"] == cfg["local_step_scaler"]:
                    st["local_step_counter"] = 0
                    st["local_step_interval"] = min(cfg["local_step_clipper"],
                                                    st["local_step_interval"] * 2)
        if st["step"] > cfg["var_freeze_step"]:
            freeze_key = True
            allreduce = False
        if freeze_key and not reinitial:
            for j in range(len(units)):
                for r in range(world):
                    worker[j][r][:] = 0
                    server[j][r][:] = 0
            reinitial = True
    json.dump({"reduced": reduced, "synced": synced,
               "p": [[x.tolist() for x in p[r]] for r in range(world)],
               "m": [[x.tolist() for x in m[r]] for r in range(world)],
               "v": [x.tolist() for x in v]}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
