#!/usr/bin/env python3
"""tools/device/trace_gaps.py on a made-up CUPTI timeline whose gaps are known.

Three steps of 1000 us between cudaMemGetInfo calls. In each: kernel A 100..400 us (asked for at
50), kernel B 410..700 (asked for at 200, before A ended: a 10 us launch gap), then the host
synchronizes (300..720), allocates (730..760) and asks for kernel C at 780, which runs 800..900:
a 100 us host-late gap, of which 20 us was inside the synchronize, 30 inside cudaMalloc and 30
host code; the 20 us from 780 to 800 is the launch itself, counted in the host gap too (the gap
is from B's end to C's start). Edges: 0..100 and 900..1000.
"""
import json
import os
import subprocess
import sys
import tempfile

root = sys.argv[1]
script = os.path.join(root, "tools/device/trace_gaps.py")
us = 1000  # ns
lines = []
corr = 1
for step in range(4):
    t = step * 1000 * us
    lines.append(f"R\t{t}\t{t + 5 * us}\t{corr}\t7\tcudaMemGetInfo_v3020")
    corr += 1
    if step == 3:
        break
    for launch, start, end, name in ((50, 100, 400, "kernelA(int)"), (200, 410, 700, "kernelB"),
                                     (780, 800, 900, "void kernelC<float>(float*)")):
        lines.append(f"R\t{t + launch * us}\t{t + (launch + 8) * us}\t{corr}\t7\tcudaLaunchKernel_v7000")
        lines.append(f"K\t{t + start * us}\t{t + end * us}\t{corr}\t13\t{name}")
        corr += 1
    lines.append(f"R\t{t + 300 * us}\t{t + 720 * us}\t{corr}\t7\tcudaStreamSynchronize_v3020")
    corr += 1
    lines.append(f"R\t{t + 730 * us}\t{t + 760 * us}\t{corr}\t7\tcudaMalloc_v3020")
    corr += 1
    lines.append(f"R\t{t + 740 * us}\t{t + 750 * us}\t{corr}\t9\tcudaFree_v3020")  # another thread
    corr += 1
lines.append("# dropped 0")

with tempfile.TemporaryDirectory() as d:
    trace = os.path.join(d, "trace.tsv")
    with open(trace, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = os.path.join(d, "gaps.json")
    p = subprocess.run([sys.executable, script, trace, "--skip", "0", "--json", out],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    r = json.load(open(out))
    m = r["mean"]
    close = lambda a, b: abs(a - b) < 1e-9
    assert len(r["steps"]) == 3, r["steps"]
    assert close(m["wall_ms"], 1.0), m
    assert close(m["busy_ms"], 0.69), m
    assert close(m["idle_ms"], 0.31), m
    assert close(m["launch_gaps_ms"], 0.01), m
    assert close(m["host_gaps_ms"], 0.10), m
    assert close(m["edge_ms"], 0.20), m
    h = r["host_calls_ms_per_step"]
    assert close(h["cudaStreamSynchronize_v3020"], 0.02), h
    assert close(h["cudaMalloc_v3020"], 0.03), h
    assert "cudaFree_v3020" not in h, h  # another thread's call is not what this one waited on
    assert close(h["(host code between CUDA calls)"], 0.03), h
    names = {k["name"]: k for k in r["kernels"]}
    assert close(names["kernelA"]["ms_per_step"], 0.3), names
    assert close(names["kernelC<float>"]["ms_per_step"], 0.1), names
    top = r["largest_gaps"][0]
    assert top["kind"] == "host" and close(top["us"], 100.0) and top["before"] == "kernelC<float>", top
    # Too few boundaries is a clear error, not a crash.
    p = subprocess.run([sys.executable, script, trace, "--skip", "5"], capture_output=True, text=True)
    assert p.returncode != 0 and "cudaMemGetInfo" in p.stderr, (p.returncode, p.stderr)
print("trace_gaps_test: ok")
