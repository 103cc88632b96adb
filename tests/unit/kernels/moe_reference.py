"""References for tests/unit/kernels/moe_test.cc: the mixture-of-experts router and a whole MoE
layer in torch ops (autograd; the routing decided in fp32, values and gradients in float64),
written from Hugging Face's Mixtral (softmax top-k gating, renormalised top-k weights,
load_balancing_loss_func), ST-MoE's router z-loss and DeepSpeed's
sharded_moe.py (_capacity, topkgating's "probs" and "position" drop policies, top2gating's
first-choices-first order, the renormalisation over the kept slots clamped at finfo.eps).
Deterministic tie-breaking: the top-k is a stable descending sort of the logits (the lower expert
wins a tie) and the "probs" drop order a stable descending sort of each expert's column (the
lower token wins). Writes OUT (JSON): per case its options, inputs and torch's outputs and
gradients. Run with Debian's /usr/bin/python3 (python3-torch)."""
import json
import sys

import torch

EPS = torch.finfo(torch.float32).eps


def capacity_of(n, e, k, cf, min_capacity):  # DeepSpeed's _capacity, as its gatings call it
    cap = torch.ceil((n / e) * torch.tensor(cf * k)).to(torch.int64)
    return max(int(cap), min_capacity)


def route(logits, o, fixed=None):
    """Returns (weights (N,k), expert (N,k) with -1 where dropped, aux, z, extras). With fixed =
    an fp32 run's extras["decisions"], the discrete choices are that run's (a float64 run then
    gives the exact values of the fp32 routing)."""
    n, e = logits.shape
    k = o["top_k"]
    probs = torch.softmax(logits, dim=1)
    lse = torch.logsumexp(logits, dim=1)
    order = torch.sort(logits.detach(), dim=1, descending=True, stable=True).indices[:, :k]
    if fixed is not None:
        order = fixed[0]
    mask = torch.zeros(n, e, dtype=torch.bool).scatter_(1, order, True)
    if o["aux_loss"] == "hf":
        # Hugging Face's load_balancing_loss_func (one layer, no attention mask).
        expert_mask = torch.nn.functional.one_hot(order, e)
        tokens_per_expert = torch.mean(expert_mask.to(probs.dtype), dim=0)
        router_prob_per_expert = torch.mean(probs, dim=0)
        aux = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * e
        aux_counts = mask.sum(dim=0)
    else:
        # DeepSpeed's l_aux: top1gating / top2gating from the first choice's one-hot mask,
        # topkgating from the top-k mask, as sharded_moe.py writes them.
        me = torch.mean(probs, dim=0)
        mask1 = torch.nn.functional.one_hot(order[:, 0], e)
        if k == 1:
            aux = torch.sum(me * torch.mean(mask1.to(probs.dtype), dim=0)) * e
        elif k == 2:
            aux = torch.mean(me * torch.mean(mask1.to(probs.dtype), dim=0)) * e * e
        else:
            aux = torch.mean(me * torch.mean(mask.to(probs.dtype), dim=0)) * e * e / k
        aux_counts = mask1.sum(dim=0) if k == 2 else mask.sum(dim=0)
    z = torch.mean(lse ** 2)
    capacity = -1
    if o["drop_tokens"]:
        capacity = capacity_of(n, e, k, o["capacity_factor"], o["min_capacity"])
        policy = o["drop_policy"]
        if policy == "probs":
            top_gate = probs.detach().gather(1, order)
            masked = torch.zeros(n, e, dtype=probs.dtype).scatter(1, order, top_gate)
            sel = torch.sort(masked, dim=0, descending=True, stable=True).indices[:min(capacity, n)]
            mask &= torch.zeros(n, e, dtype=torch.bool).scatter_(0, sel, True)
        elif policy == "position":
            locations = torch.cumsum(mask.long(), dim=0) - 1
            mask &= locations < capacity
        else:  # choice_rank: top2gating's order generalised to k choices
            kept = torch.zeros(n, e, dtype=torch.bool)
            before = torch.zeros(e, dtype=torch.long)
            for j in range(k):
                mj = torch.nn.functional.one_hot(order[:, j], e)
                loc = torch.cumsum(mj, dim=0) - 1 + before
                before = before + mj.sum(dim=0)
                kept |= (mj.bool() & (loc < capacity))
            mask = kept
    if fixed is not None:
        mask = fixed[1]
    kept_slots = mask.gather(1, order)
    gates = probs.gather(1, order) * kept_slots.to(probs.dtype)
    if o["renormalize"]:
        gates = gates / torch.clamp(gates.sum(dim=1, keepdim=True), min=EPS)
    expert = torch.where(kept_slots, order, torch.full_like(order, -1))
    extras = {"probs": probs, "lse": lse, "aux_counts": aux_counts, "kept": mask.sum(dim=0),
              "capacity": capacity, "decisions": (order, mask)}
    return gates, expert, aux, z, extras


def router_case(name, o, logits, seed):
    """The routing decisions of torch's fp32 run; values and gradients from float64 on the same
    fp32 inputs and decisions (exact to ~1e-16), plus torch's fp32 gradient for comparison."""
    g = torch.Generator().manual_seed(seed)
    dweight = torch.randn(logits.shape[0], o["top_k"], generator=g)
    runs = {}
    fixed = None
    for dtype in (torch.float32, torch.float64):
        lg = logits.detach().to(dtype).clone().requires_grad_(True)
        w, expert, aux, z, x = route(lg, o, fixed)
        fixed = x["decisions"]
        obj = (w * dweight.to(dtype)).sum() + o["aux_coef"] * aux + o["z_coef"] * z
        obj.backward()
        runs[dtype] = (w, expert, aux, z, x, lg.grad)
    w, expert, aux, z, x, dlogits = runs[torch.float64]
    _, expert32, _, _, x32, dlogits32 = runs[torch.float32]
    return {"name": name, "options": o, "logits": logits.detach().flatten().tolist(),
            "N": logits.shape[0], "dweight": dweight.flatten().tolist(),
            "weight": w.detach().flatten().tolist(), "expert": expert32.flatten().tolist(),
            "probs": x["probs"].detach().flatten().tolist(),
            "lse": x["lse"].detach().tolist(), "aux": aux.item(), "z": z.item(),
            "aux_counts": x32["aux_counts"].tolist(), "kept": x32["kept"].tolist(),
            "capacity": x32["capacity"], "dlogits": dlogits.flatten().tolist(),
            "dlogits_fp32": dlogits32.flatten().tolist()}


def layer_case(name, o, n, c, oc, router_bias, seed):
    """A whole layer: logits = x Wg^T + router_bias (a constant), y = sum over kept slots of
    weight * (x W_e^T + b_e); objective sum(y * dy) + aux_coef * aux + z_coef * z. Decisions from
    torch's fp32 run, values and gradients from float64 as in router_case."""
    g = torch.Generator().manual_seed(seed)
    e = o["num_experts"]
    inputs = {"x": torch.randn(n, c, generator=g), "wg": torch.randn(e, c, generator=g) * 0.5,
              "w": torch.randn(e, oc, c, generator=g) * 0.2,
              "b": torch.randn(e, oc, generator=g) * 0.1}
    dy = torch.randn(n, oc, generator=g)
    fixed = None
    for dtype in (torch.float32, torch.float64):
        t = {key: v.detach().to(dtype).clone().requires_grad_(True) for key, v in inputs.items()}
        logits = t["x"] @ t["wg"].t() + torch.tensor(router_bias, dtype=dtype)
        weight, expert, aux, z, extras = route(logits, o, fixed)
        if fixed is None:
            fixed, expert32, kept32 = extras["decisions"], expert, extras["kept"]
        y = torch.zeros(n, oc, dtype=dtype)
        for j in range(o["top_k"]):
            for ex in range(e):
                rows = (expert[:, j] == ex).nonzero().flatten()
                if rows.numel() == 0:
                    continue
                out = t["x"][rows] @ t["w"][ex].t() + t["b"][ex]
                y = y.index_add(0, rows, weight[rows, j:j + 1] * out)
        obj = (y * dy.to(dtype)).sum() + o["aux_coef"] * aux + o["z_coef"] * z
        obj.backward()
    flat = lambda v: v.detach().flatten().tolist()
    return {"name": name, "options": o, "N": n, "C": c, "OC": oc, "router_bias": router_bias,
            **{key: flat(v) for key, v in inputs.items()}, "dy": flat(dy), "y": flat(y),
            "expert": flat(expert32), "kept": kept32.tolist(), "aux": aux.item(), "z": z.item(),
            **{"d" + key: flat(v.grad) for key, v in t.items()}}


def opts(e, k, renormalize=True, drop=False, cf=1.0, min_capacity=0, policy="probs",
         aux_coef=0.02, z_coef=0.001, aux="hf"):
    return {"num_experts": e, "top_k": k, "renormalize": renormalize, "drop_tokens": drop,
            "capacity_factor": cf, "min_capacity": min_capacity, "drop_policy": policy,
            "aux_coef": aux_coef, "z_coef": z_coef, "aux_loss": aux}


def main():
    torch.manual_seed(2024)
    rnd = lambda n, e, s=1.0: torch.randn(n, e) * s
    # Ties: values from a small set, so rows share maxima and tokens share probabilities.
    ties = torch.randint(0, 3, (64, 8)).float() * 0.5
    ties[5:9] = ties[4]  # identical rows: equal probabilities across tokens
    one_expert = rnd(40, 6)
    one_expert[:, 3] += 30.0  # every token's first choice is expert 3
    empty = rnd(48, 8)
    empty[:, 0:3] -= 40.0  # experts 0..2 never chosen
    cases = [
        router_case("random k2 dropless", opts(8, 2), rnd(64, 8), 1),
        router_case("random k2 probs cf1", opts(8, 2, drop=True, cf=1.0), rnd(64, 8, 2.0), 2),
        router_case("random k2 position cf1", opts(8, 2, drop=True, policy="position"),
                    rnd(64, 8, 2.0), 3),
        router_case("random k2 choice_rank cf1", opts(8, 2, drop=True, policy="choice_rank"),
                    rnd(64, 8, 2.0), 4),
        router_case("switch k1 no-renorm probs cf1.25",
                    opts(8, 1, renormalize=False, drop=True, cf=1.25), rnd(64, 8, 2.0), 5),
        router_case("k3 E6 position cf0.5 min4",
                    opts(6, 3, drop=True, cf=0.5, min_capacity=4, policy="position"),
                    rnd(50, 6), 6),
        router_case("k3 E6 choice_rank cf0.7 no-renorm",
                    opts(6, 3, renormalize=False, drop=True, cf=0.7, policy="choice_rank"),
                    rnd(50, 6), 7),
        router_case("ties k2 dropless", opts(8, 2), ties, 8),
        router_case("ties k2 probs cf0.75", opts(8, 2, drop=True, cf=0.75), ties, 9),
        router_case("ties k2 position cf0.75", opts(8, 2, drop=True, cf=0.75, policy="position"),
                    ties, 10),
        router_case("all to one expert dropless", opts(6, 2), one_expert, 11),
        router_case("all to one expert probs cf1", opts(6, 2, drop=True), one_expert, 12),
        router_case("all to one expert k1 choice_rank",
                    opts(6, 1, renormalize=False, drop=True, policy="choice_rank"),
                    one_expert, 13),
        router_case("empty experts k2 probs cf1.5", opts(8, 2, drop=True, cf=1.5), empty, 14),
        router_case("capacity above N", opts(4, 2, drop=True, cf=8.0, min_capacity=100),
                    rnd(20, 4), 15),
        router_case("one expert", opts(1, 1), rnd(10, 1), 16),
        router_case("k = E", opts(4, 4, drop=True, cf=0.6, policy="position"), rnd(30, 4), 17),
        router_case("deepspeed top1 aux", opts(8, 1, renormalize=False, drop=True, cf=1.0,
                                               aux="deepspeed", aux_coef=0.1), rnd(64, 8), 18),
        router_case("deepspeed top2 aux", opts(8, 2, drop=True, cf=1.0, policy="choice_rank",
                                               aux="deepspeed", aux_coef=0.1), rnd(64, 8), 19),
        router_case("deepspeed top3 aux", opts(8, 3, drop=True, cf=1.0, aux="deepspeed",
                                               aux_coef=0.1), rnd(64, 8), 20),
    ]
    layers = [
        layer_case("layer k2 dropless", opts(4, 2), 48, 16, 24, [0.0] * 4, 21),
        layer_case("layer k2 probs cf0.8, an empty expert", opts(4, 2, drop=True, cf=0.8),
                   48, 16, 24, [0.0, -40.0, 0.0, 0.5], 22),
        layer_case("layer k1 switch choice_rank",
                   opts(5, 1, renormalize=False, drop=True, cf=1.0, policy="choice_rank"),
                   40, 12, 20, [0.0] * 5, 23),
        layer_case("layer k2 deepspeed top2", opts(4, 2, drop=True, cf=1.0, policy="choice_rank",
                                                   aux="deepspeed", aux_coef=0.1),
                   48, 16, 24, [0.0] * 4, 24),
    ]
    with open(sys.argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "router": cases, "layer": layers}, f)


if __name__ == "__main__":
    main()
