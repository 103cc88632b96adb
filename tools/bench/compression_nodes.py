"""Communication compression across real processes (issue 24, item 4): the compression bench's
shape (GPT-2, 4 layers, 256 wide, 4 heads, vocab 50257, seq 128, micro-batch 2 per rank, fp32,
ZeRO stage 0) trained by `zerod train --nnodes N --nproc-per-node R` on 127.0.0.1 (N processes,
each a "node" of R ranks: threads of the process, Gloo over loopback between every pair), three
ways one after the other: AdamW, PowerSGD rank --rank from the first step, OneBitAdam with
freeze_step = --warmup. Per setting: rank 0's comms logger totals (the `comms_logger` verbose
lines, exact bytes) differenced between the end of step --warmup and the last step, per step and
by kind of collective, in NCCL's size convention and on the wire (x 2(n-1)/n for all_reduce,
x (n-1)/n for all_gather / all_to_all / reduce_scatter: what a rank sends); the median step time
from csv_monitor's tokens/s over the same steps. With --link-bits, Gloo's sends are paced to
that many bits/s (ZEROD_GLOO_RATE_LIMIT_BPS, comm/gloo/rate_limiter.h; receives are not limited,
no latency is added; not a shaped interface): --link-scope node (the default) gives each process
one link for its sends to the other processes' ranks, shared by its ranks, and leaves the sends
between its own ranks unthrottled (a node's uplink); --link-scope rank paces every rank's sends
to every peer, inside a node too (ZEROD_GLOO_RATE_LIMIT_SCOPE).

  python3 tools/bench/compression_nodes.py --zerod build/engine/zerod [--nnodes 2]
      [--nproc-per-node 2] [--rank 4] [--warmup 2] [--steps 4] [--link-bits 0]
      [--link-scope node|rank] [--dir DIR]

Exits 1 when, after the freeze, OneBitAdam's bytes per step on the wire are not at least 16x
smaller than AdamW's, or PowerSGD's (NCCL size convention) not at least 10x smaller.
"""
import argparse
import csv
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

HEADER = re.compile(r"communication of rank 0 so far \(comms_logger\), per communicator, (\d+) step")
BLOCK = re.compile(r"^ group '([^']+)'")
TOTAL = re.compile(r"^  (\w+)\s+\d+ calls\s+\S+ \S+ \((\d+) B\)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def totals_by_step(log_text):
    """{steps: {op: bytes}} of the world communicator's block (the 'data' group at pure DP)."""
    out, steps, group = {}, None, None
    for line in log_text.splitlines():
        m = HEADER.search(line)
        if m:
            steps, group = int(m.group(1)), None
            out[steps] = {}
            continue
        m = BLOCK.match(line)
        if m:
            group = m.group(1)
            continue
        m = TOTAL.match(line)
        if m and steps is not None and group == "data":
            out[steps][m.group(1)] = int(m.group(2))
    return out


def wire_factor(op, n):
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "all_to_all", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def write_job(path, name, optimizer, extra, world, steps, data_glob):
    with open(path, "w") as f:
        f.write(f"""{{"train_batch_size": {2 * world}, "train_micro_batch_size_per_gpu": 2,
 "optimizer": {optimizer}, "gradient_clipping": 1.0,
 "zero_optimization": {{"stage": 0}}, "steps_per_print": 1,
 "comms_logger": {{"enabled": true, "verbose": true}},
 "csv_monitor": {{"enabled": true, "output_path": "runs", "job_name": "{name}"}},
 "model": {{"type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 256, "vocab_size": 50257,
            "seq_len": 128}},
 "data": {{"train": "{data_glob}", "seed": 1}},
 "train": {{"steps": {steps}, "eval_interval": 0, "seed": 1}}{extra}}}
""")


def run_setting(a, d, name, optimizer, extra, env):
    world = a.nnodes * a.nproc_per_node
    job = os.path.join(d, name + ".json")
    write_job(job, name, optimizer, extra, world, a.warmup + a.steps, a.data)
    port = free_port()
    procs, logs = [], []
    for node in range(a.nnodes):
        log = open(os.path.join(d, f"{name}.node{node}.log"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [a.zerod, "train", job, "--nnodes", str(a.nnodes), "--node-rank", str(node),
             "--nproc-per-node", str(a.nproc_per_node), "--master", f"127.0.0.1:{port}"],
            cwd=d, stdout=log, stderr=subprocess.STDOUT, env=env))
    codes = [p.wait(timeout=1800) for p in procs]
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    if any(codes):
        sys.exit(f"{name}: exit codes {codes}\n" + texts[0][-3000:] + texts[-1][-3000:])
    by_step = totals_by_step(texts[0])
    first, last = a.warmup, a.warmup + a.steps
    ops = sorted(set(by_step[last]) | set(by_step[first]))
    per_op = {op: (by_step[last].get(op, 0) - by_step[first].get(op, 0)) / a.steps for op in ops}
    size = sum(per_op.values())
    wire = sum(b * wire_factor(op, world) for op, b in per_op.items())
    tokens = 2 * world * 128
    with open(os.path.join(d, "runs", name, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    seconds = [tokens / float(r["tokens_per_s"]) for r in rows[first:last]]
    return {"name": name, "per_op": per_op, "size": size, "wire": wire,
            "step_ms": statistics.median(seconds) * 1e3,
            "loss": [float(r["loss"]) for r in rows]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--zerod", default="build/engine/zerod")
    p.add_argument("--nnodes", type=int, default=2)
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument("--rank", type=int, default=4, help="PowerSGD's rank")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps; OneBitAdam's freeze_step")
    p.add_argument("--steps", type=int, default=4, help="measured steps")
    p.add_argument("--link-bits", type=float, default=0, help="each rank's send rate (0: none)")
    p.add_argument("--link-scope", choices=["node", "rank"], default="node",
                   help="what --link-bits limits: each process's sends to other processes, or "
                        "every rank's sends")
    p.add_argument("--data", default="", help="token shards glob (default: the demo corpus)")
    p.add_argument("--dir", default="", help="work directory (default: a temporary one)")
    a = p.parse_args()
    a.zerod = os.path.abspath(a.zerod)
    d = a.dir or tempfile.mkdtemp(prefix="zerod_compression_nodes_")
    os.makedirs(d, exist_ok=True)
    if not a.data:  # the demo corpus (byte tokens), written by one demo step
        subprocess.run([a.zerod, "train", "--demo-dir", os.path.join(d, "demo"), "--steps", "1"],
                       cwd=d, check=True, capture_output=True)
        a.data = os.path.join(d, "demo", "data", "demo_train_*.bin")
    a.data = os.path.abspath(os.path.join(d, a.data)) if not os.path.isabs(a.data) else a.data
    env = dict(os.environ)
    env.pop("ZEROD_GLOO_RATE_LIMIT_BPS", None)
    env.pop("ZEROD_GLOO_RATE_LIMIT_SCOPE", None)
    if a.link_bits > 0:
        env["ZEROD_GLOO_RATE_LIMIT_BPS"] = f"{a.link_bits:g}"
        env["ZEROD_GLOO_RATE_LIMIT_SCOPE"] = a.link_scope
    adam = '{"type": "AdamW", "params": {"lr": 1e-3}}'
    settings = [
        ("AdamW", adam, ""),
        (f"PowerSGD-r{a.rank}", adam,
         f', "communication_compression": {{"type": "powersgd", "rank": {a.rank}, "start_iter": 0}}'),
        ("OneBitAdam", f'{{"type": "OneBitAdam", "params": {{"lr": 1e-3, "freeze_step": {a.warmup}}}}}',
         ""),
    ]
    world = a.nnodes * a.nproc_per_node
    throttle = "unthrottled"
    if a.link_bits > 0 and a.link_scope == "node":
        throttle = f"paced to {a.link_bits:g} bits/s per process (sends to other processes' ranks)"
    elif a.link_bits > 0:
        throttle = f"paced to {a.link_bits:g} bits/s per rank (every send)"
    print(f"{a.nnodes} processes x {a.nproc_per_node} ranks = world {world} on 127.0.0.1, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; Gloo sends "
          f"{throttle}; "
          f"{a.warmup} warm-up + {a.steps} measured steps")
    results = [run_setting(a, d, *s, env) for s in settings]
    base = results[0]
    print("| setting | step ms | vs AdamW | bytes/step (NCCL size) | AdamW / it | bytes/step on "
          "the wire | AdamW / it | by collective (size) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        ops = ", ".join(f"{op} {b:,.0f}" for op, b in r["per_op"].items() if b > 0)
        print(f"| {r['name']} | {r['step_ms']:.1f} | {r['step_ms'] / base['step_ms']:.2f} | "
              f"{r['size']:,.0f} | {base['size'] / r['size']:.1f} | {r['wire']:,.0f} | "
              f"{base['wire'] / r['wire']:.1f} | {ops} |")
    print(f"load after: {os.getloadavg()[0]:.2f}; work directory {d}")
    if not a.dir:
        shutil.rmtree(d, ignore_errors=True)
    psgd, onebit = results[1], results[2]
    if base["wire"] / onebit["wire"] < 16 or base["size"] / psgd["size"] < 10:
        print("FAILED: OneBitAdam < 16x on the wire or PowerSGD < 10x", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
