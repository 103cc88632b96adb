#!/usr/bin/env python3
"""Per-kernel GPU time from an Nsight Compute CSV (ncu --csv --metrics gpu__time_duration.sum).

    python3 tools/device/ncu_summary.py NCU.csv [--top 40] [--json OUT.json]

Groups the launches by kernel (the demangled name without its argument list), prints count,
total and mean microseconds and the share of the total, largest first."""
import argparse
import collections
import csv
import json
import re
import sys

UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3}


def short(name):
    # "void zerod::cuda::(anonymous namespace)::mma_forward_kernel<__nv_bfloat16, 64>(...)" ->
    # "mma_forward_kernel<__nv_bfloat16, 64>"
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"^void ", "", name)
    depth, cut, last_colon = 0, len(name), -1
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i  # the argument list starts here
            break
        elif ch == ":" and depth == 0:
            last_colon = i
    return name[last_colon + 1:cut][:120]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--json")
    a = ap.parse_args()
    lines = open(a.csv, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit("ncu_summary: no CSV header in " + a.csv)
    total = collections.defaultdict(float)
    count = collections.Counter()
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(row["Metric Value"].replace(",", "")) * UNITS.get(row.get("Metric Unit", "nsecond"), 1e-3)
        k = short(row["Kernel Name"])
        total[k] += us
        count[k] += 1
    grand = sum(total.values())
    rows = sorted(total.items(), key=lambda kv: -kv[1])
    print(f"{'kernel':<80}{'launches':>9}{'total us':>12}{'mean us':>10}{'share':>8}")
    for k, us in rows[: a.top]:
        print(f"{k:<80}{count[k]:>9}{us:>12.1f}{us / count[k]:>10.1f}{us / grand:>8.1%}")
    print(f"{'all kernels':<80}{sum(count.values()):>9}{grand:>12.1f}")
    if a.json:
        json.dump({"total_us": grand, "kernels": [{"kernel": k, "launches": count[k], "total_us": us} for k, us in rows]},
                  open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
