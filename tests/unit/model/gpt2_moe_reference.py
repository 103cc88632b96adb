"""Reference for tests/unit/model/gpt2_moe_torch_test.cc: a GPT-2 whose MoE blocks are
DeepSpeed-MoE layers (zerod's model.moe section), in torch float64 autograd, written from llm.c's
GPT-2 (learned positions, pre-LayerNorm eps 1e-5, causal attention, tanh GELU MLP, tied head)
and DeepSpeed's MOELayer (a router Linear without bias, the gating of
tests/unit/kernels/moe_reference.py's route(): top-k, capacity, drop order, renormalisation,
l_aux and z-loss; the experts' outputs combined with the gate weights; shared experts added).
The objective is the mean cross-entropy + aux_coef x sum of the blocks' l_aux + z_coef x sum of
their z-losses.

  python3 gpt2_moe_reference.py IN.json OUT.json

IN: the spec ("n_layer", "n_head", "n_embd", "vocab_size", "layer_frequency", "moe" options as
route() takes them plus "shared_experts"), "B", "T", "inputs", "targets" (-1: no loss) and
"tensors": {zerod name: {"shape", "data"}} in zerod's storage (matmul weights (out, in); wte's
real rows only). OUT: "loss" (cross-entropy), "aux", "z" (sums over the blocks), "objective", and
"grads": {name: flat gradient of the objective}.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels"))
from moe_reference import route  # noqa: E402

torch.set_default_dtype(torch.float64)


def gelu(x):  # GPT-2's gelu_new (tanh approximation), as llm.c
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def main():
    with open(sys.argv[1]) as f:
        j = json.load(f)
    s = j["spec"]
    W = {k: torch.tensor(v["data"]).reshape(v["shape"]).requires_grad_(True)
         for k, v in j["tensors"].items()}
    B, T, C, NH = j["B"], j["T"], s["n_embd"], s["n_head"]
    HS = C // NH
    o = s["moe"]
    inputs = torch.tensor(j["inputs"]).reshape(B, T)
    targets = torch.tensor(j["targets"]).reshape(B * T)

    def linear(x, name):
        y = x @ W[name + ".weight"].T
        b = name + ".bias"
        return y + W[b] if b in W else y

    def layernorm(x, name):
        return torch.nn.functional.layer_norm(x, (C,), W[name + ".weight"], W[name + ".bias"], 1e-5)

    def mlp(x, p):
        return linear(gelu(linear(x, p + "c_fc")), p + "c_proj")

    aux_sum, z_sum = 0.0, 0.0
    x = W["wte.weight"][inputs] + W["wpe.weight"][:T][None]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(s["n_layer"]):
        p = f"h.{l}."
        h = layernorm(x, p + "ln_1")
        q, k, v = linear(h, p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.reshape(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, p + "attn.c_proj")
        h = layernorm(x, p + "ln_2").reshape(B * T, C)
        if l % s["layer_frequency"] != 0:
            out = mlp(h, p + "mlp.")
        else:
            m = p + "mlp.deepspeed_moe."
            logits = h @ W[m + "gate.wg.weight"].T
            gates, expert, aux, z, _ = route(logits, o)
            out = torch.zeros_like(h)
            for e in range(o["num_experts"]):
                rows, slot = torch.nonzero(expert == e, as_tuple=True)
                if len(rows) == 0:
                    continue
                ye = mlp(h[rows], m + f"experts.deepspeed_experts.{e}.")
                out = out.index_add(0, rows, gates[rows, slot][:, None] * ye)
            if o["shared_experts"] > 0:
                out = out + mlp(h, m + "shared_experts.")
            aux_sum = aux_sum + aux
            z_sum = z_sum + z
        x = x + out.reshape(B, T, C)
    x = layernorm(x, "ln_f").reshape(B * T, C)
    logits = x @ W["wte.weight"].T
    loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-1)
    objective = loss + o["aux_coef"] * aux_sum + o["z_coef"] * z_sum
    objective.backward()
    out = {"loss": loss.item(), "aux": float(aux_sum), "z": float(z_sum),
           "objective": objective.item(),
           "grads": {k: (w.grad if w.grad is not None else torch.zeros_like(w)).reshape(-1).tolist()
                     for k, w in W.items()}}  # (an expert no token reached: no gradient)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
