#!/usr/bin/env python3
"""Where a training step's GPU sits idle, from a CUPTI timeline (tools/device/cupti_trace.cc).

    trace_gaps.py TRACE.tsv [--boundary cudaMemGetInfo] [--skip 2] [--json OUT.json] [--top 15]

Steps are the host intervals between consecutive calls of --boundary (zerod_gpu_bench calls
cudaMemGetInfo once after every step); the first --skip steps are left out. For each step:
the wall time, the time some kernel, copy or memset ran (their union), and every idle gap between
two GPU operations, each put in one class:
  launch   the host had asked for the next operation before the previous one ended: the gap is
           the GPU's own time from one operation to the next (what CUDA graphs shrink);
  host     the host asked for it only after the previous one ended, late by that much: the gap
           is host time, and the CUDA calls the host made meanwhile are named (a synchronize, an
           allocation), the rest is host code between CUDA calls;
  edge     from the step's start to its first operation, and from its last to the step's end.
Also each kernel's time per step (CUPTI's, at the clocks the run had, no replay).
"""
import argparse
import bisect
import collections
import json
import re
import shutil
import subprocess
import sys


def load(path):
    gpu, api = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line or line[0] == "#":
                continue
            p = line.rstrip("\n").split("\t")
            kind = p[0]
            if kind in ("K", "M", "S"):
                name = p[5] if kind == "K" else ("memcpy" if kind == "M" else "memset")
                if kind == "M":
                    name = "memcpy " + {"1": "HtoD", "2": "DtoH", "8": "DtoD"}.get(p[5], "kind " + p[5])
                gpu.append((int(p[1]), int(p[2]), int(p[3]), name))
            elif kind in ("R", "D"):
                api.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), p[5], kind))
    gpu.sort()
    api.sort()
    return demangle(gpu), api


def demangle(gpu):
    """Kernel names through c++filt where it is installed (CUPTI reports mangled names)."""
    mangled = sorted({g[3] for g in gpu if g[3].startswith("_Z")})
    if not mangled or shutil.which("c++filt") is None:
        return gpu
    p = subprocess.run(["c++filt"], input="\n".join(mangled) + "\n", capture_output=True,
                       text=True)
    plain = p.stdout.split("\n")
    if p.returncode != 0 or len(plain) < len(mangled):
        return gpu
    names = dict(zip(mangled, plain))
    return [(g[0], g[1], g[2], names.get(g[3], g[3])) for g in gpu]


def short(name, width=70):
    """A kernel's name without `void `, its namespaces and its argument list."""
    name = name[5:] if name.startswith("void ") else name
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"^(\w+::)+", "", name)
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i] if i > 0 else name
                break
    return name if len(name) <= width else name[: width - 3] + "..."


def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


def analyse(gpu, api, boundary="cudaMemGetInfo", skip=2, top=15):
    marks = [a[0] for a in api if a[5] == "R" and a[4].startswith(boundary)]
    if len(marks) < skip + 2:
        raise SystemExit(f"trace_gaps: {len(marks)} calls of {boundary} in the trace: need at "
                         f"least {skip + 2} to find {skip} + 1 steps")
    starts = [a[0] for a in api]
    launch_of = {}
    for a in api:  # the call that asked for each GPU operation (runtime, else driver)
        if a[2] not in launch_of or a[5] == "R":
            launch_of[a[2]] = a
    steps, gaps = [], []
    per_kernel = collections.defaultdict(lambda: [0, 0])
    host_calls = collections.Counter()
    pairs = collections.Counter()
    windows = list(zip(marks[skip:-1], marks[skip + 1:]))
    for s0, s1 in windows:
        ops = [g for g in gpu if s0 <= g[0] < s1]
        busy = 0
        cls = collections.Counter()
        end = s0
        prev = None
        for g in ops:
            per_kernel[g[3]][0] += g[1] - g[0]
            per_kernel[g[3]][1] += 1
            if g[0] > end:
                gap = g[0] - end
                if prev is None:
                    kind = "edge"
                else:
                    la = launch_of.get(g[2])
                    kind = "host" if la is not None and la[0] > end else "launch"
                    if kind == "host":
                        late = la[0] - end
                        inside = collections.Counter()
                        lo = bisect.bisect_left(starts, end - 200_000_000)  # (calls under 200 ms)
                        for a in api[lo:bisect.bisect_left(starts, la[0])]:
                            if a[1] > end and a[3] == la[3] and a[2] != g[2]:
                                inside[a[4]] += overlap(a[0], a[1], end, la[0])
                        for k, v in inside.items():
                            host_calls[k] += v
                        host_calls["(host code between CUDA calls)"] += max(0, late - sum(inside.values()))
                    pairs[(kind, short(prev[3], 40), short(g[3], 40))] += gap
                    gaps.append({"kind": kind, "us": gap / 1e3, "after": short(prev[3]),
                                 "before": short(g[3])})
                cls[kind] += gap
            busy += max(0, g[1] - max(g[0], end))
            end = max(end, g[1])
            prev = g
        if end < s1:
            cls["edge"] += s1 - end
        steps.append({"wall_ms": (s1 - s0) / 1e6, "busy_ms": busy / 1e6,
                      "idle_ms": (s1 - s0 - busy) / 1e6, "ops": len(ops),
                      "launch_gaps_ms": cls["launch"] / 1e6, "host_gaps_ms": cls["host"] / 1e6,
                      "edge_ms": cls["edge"] / 1e6})
    n = len(windows)
    mean = {k: sum(s[k] for s in steps) / n for k in steps[0]}
    kernels = sorted(((v[0] / n / 1e6, v[1] / n, k) for k, v in per_kernel.items()), reverse=True)
    return {
        "steps": steps,
        "mean": mean,
        "kernels": [{"name": short(k, 120), "ms_per_step": ms, "launches_per_step": c}
                    for ms, c, k in kernels],
        "host_calls_ms_per_step": {k: v / n / 1e6 for k, v in host_calls.most_common()},
        "gap_pairs": [{"kind": k[0], "after": k[1], "before": k[2], "ms_per_step": v / n / 1e6}
                      for k, v in pairs.most_common(top)],
        "largest_gaps": sorted(gaps, key=lambda g: -g["us"])[:top],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--boundary", default="cudaMemGetInfo")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json")
    a = ap.parse_args()
    gpu, api = load(a.trace)
    r = analyse(gpu, api, a.boundary, a.skip, a.top)
    m = r["mean"]
    print(f"{len(r['steps'])} steps: wall {m['wall_ms']:.3f} ms, GPU busy {m['busy_ms']:.3f} ms, "
          f"idle {m['idle_ms']:.3f} ms (launch gaps {m['launch_gaps_ms']:.3f}, host late "
          f"{m['host_gaps_ms']:.3f}, step edges {m['edge_ms']:.3f}), {m['ops']:.0f} GPU ops a step")
    print("\nkernels (ms per step, launches per step):")
    for k in r["kernels"][: a.top]:
        print(f"  {k['ms_per_step']:8.3f}  {k['launches_per_step']:6.0f}  {k['name']}")
    print("\nhost time while the GPU waited (ms per step):")
    for k, v in list(r["host_calls_ms_per_step"].items())[: a.top]:
        print(f"  {v:8.3f}  {k}")
    print("\nidle between operations, by pair (ms per step):")
    for p in r["gap_pairs"]:
        print(f"  {p['ms_per_step']:8.3f}  {p['kind']:6s}  {p['after']} -> {p['before']}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
