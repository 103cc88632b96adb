"""The table of tools/bench/train_baselines.sh: reads the per-round results it left in a
directory, prints the markdown tables (median tokens/s and spread over the rounds, GFLOP/s,
ratios to every PyTorch mode, the issue-21 targets; DeepSpeed beside zerod per world and stage)
and writes them as JSON.

  python baselines_table.py DIR ROUNDS DS_ROUNDS DEEPSPEED(0|1) JSON_OUT THREADS "ARGS"
"""
import datetime
import json
import re
import statistics
import subprocess
import sys

TORCH_MODES = ["torch-eager-fp32", "torch-compile-fp32", "torch-eager-bf16", "torch-compile-bf16"]
MODES = TORCH_MODES + ["zerod-fp32", "zerod-bf16"]
TARGETS = [  # (numerator, denominator, at least): issue 21, item 3
    ("zerod-fp32", "torch-compile-fp32", 1.5),
    ("zerod-bf16", "torch-compile-bf16", 1.3),
    ("zerod-bf16", "zerod-fp32", 1.4),
]
ZERO_ROW = re.compile(r"^\s*(\d)\s+none\s+\S+\s+([\d.]+)\s+([\d.]+)")


def cpu_model():
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def main():
    tmp, rounds, ds_rounds, ds, json_out, threads, args = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4] == "1", sys.argv[5], int(sys.argv[6]), sys.argv[7]
    runs = {m: [json.load(open(f"{tmp}/{m}.{r}.json")) for r in range(1, rounds + 1)] for m in MODES}
    mflop = runs["zerod-fp32"][0]["mflop_per_token"]
    rows = {m: summary([x["tokens_per_s"] for x in runs[m]]) for m in MODES}
    for m in MODES:
        rows[m]["gflops"] = rows[m]["median"] * mflop / 1e3
    zb = runs["zerod-bf16"][0]
    zf = runs["zerod-fp32"][0]
    out = {
        "date": datetime.date.today().isoformat(), "cpu": cpu_model(), "threads": threads, "args": args,
        "torch": runs["torch-eager-fp32"][0]["torch"], "mflop_per_token": mflop, "modes": rows,
        "gemm_limits_gflops": {"sgemm_ours_2048": zf["sgemm_ours_2048"], "sgemm_ours_head": zf["sgemm_ours_head"],
                               "sgemm_openblas_2048": zf["sgemm_openblas_2048"],
                               "bf16gemm_2048": zb["bf16gemm_2048"], "bf16gemm_head": zb["bf16gemm_head"]},
    }
    notes = sorted(set(open(f"{tmp}/notes").read().splitlines()) - {""})
    print(f"\n## {out['cpu']}, {threads} threads, torch {out['torch']}, {out['date']}; args: {args}")
    for n in notes:
        print(f"  {n}")
    print("\n| mode | tokens/s (median) | spread | GFLOP/s | " + " | ".join(f"vs {m[6:]}" for m in TORCH_MODES) + " |")
    print("|---|---|---|---|" + "---|" * len(TORCH_MODES))
    for m in MODES:
        r = rows[m]
        ratios = {t: r["median"] / rows[t]["median"] for t in TORCH_MODES}
        r["ratios"] = ratios
        print(f"| {m} | {r['median']:.0f} | {r['min']:.0f}-{r['max']:.0f} | {r['gflops']:.0f} | "
              + " | ".join(f"{ratios[t]:.2f}x" for t in TORCH_MODES) + " |")
    g = out["gemm_limits_gflops"]
    print(f"\nGEMM limits in the same run (GFLOP/s): fp32 ours 2048^3 {g['sgemm_ours_2048']:.0f}, LM head "
          f"{g['sgemm_ours_head']:.0f}; OpenBLAS 2048^3 {g['sgemm_openblas_2048']:.0f}; bf16 (converted operands) "
          f"2048^3 {g['bf16gemm_2048']:.0f}, LM head {g['bf16gemm_head']:.0f}")
    out["targets"] = []
    for a, b, want in TARGETS:
        got = rows[a]["median"] / rows[b]["median"]
        ok = got >= want
        out["targets"].append({"what": f"{a} / {b}", "ratio": got, "target": want, "met": ok})
        print(f"target {a} / {b} >= {want:.2f}x: {got:.2f}x {'met' if ok else 'MISSED'}")
    if ds:
        out["deepspeed"] = []
        print("\n| world | ZeRO stage | DeepSpeed tokens/s | spread | zerod tokens/s | spread | zerod / DeepSpeed |")
        print("|---|---|---|---|---|---|---|")
        for world in (1, 2):
            zero = {0: [], 3: []}
            for r in range(1, ds_rounds + 1):
                for line in open(f"{tmp}/zero-w{world}.{r}.txt"):
                    mt = ZERO_ROW.match(line)
                    if mt:
                        zero[int(mt.group(1))].append(float(mt.group(3)))
            for stage in (0, 3):
                d = summary([json.load(open(f"{tmp}/ds-w{world}-s{stage}.{r}.json"))["tokens_per_s"]
                             for r in range(1, ds_rounds + 1)])
                z = summary(zero[stage])
                out["deepspeed"].append({"world": world, "stage": stage, "deepspeed": d, "zerod": z,
                                         "ratio": z["median"] / d["median"]})
                print(f"| {world} | {stage} | {d['median']:.0f} | {d['min']:.0f}-{d['max']:.0f} | {z['median']:.0f} | "
                      f"{z['min']:.0f}-{z['max']:.0f} | {z['median'] / d['median']:.2f}x |")
        out["deepspeed_version"] = json.load(open(f"{tmp}/ds-w1-s0.1.json"))["deepspeed"]
    with open(json_out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\n(written to {json_out})")


if __name__ == "__main__":
    main()
