#!/usr/bin/env python3
"""Soak test of elastic training (docs/elastic.md), not run in CI.

Runs `zerod train --nnodes MIN:MAX` agents on 127.0.0.1 for --minutes, and every --interval
seconds (with jitter) kills a random node with SIGKILL (node 0, the rendezvous host, too, unless
--spare-node0: the next node takes the rendezvous over) or starts a new one. The job takes
in-memory snapshots every --snapshot steps (0: none; disk checkpoints every 10 steps either way).
At the end it stops the job with SIGTERM (an agreed-step save), runs the same job undisturbed
with MAX nodes to the same step, and reports: failures survived, rendezvous takeovers, joins
admitted, steps lost per failure, and the final loss against the undisturbed run's.

    tools/elastic_soak.py --zerod build/engine/zerod --minutes 30 --interval 60
    tools/elastic_soak.py --zerod build/engine/zerod --minutes 2 --interval 15   # a short one

Every process it starts is killed when it ends (also on Ctrl-C). Exit 0 when the job survived
every disturbance and the final loss is within --tolerance of the undisturbed run's.
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_job(path, data_glob, ckpt, steps, name, snapshot=0, shm=""):
    job = {
        "train_batch_size": 12,
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2},
        "steps_per_print": 1,
        "csv_monitor": {"enabled": True, "output_path": "runs", "job_name": name},
        "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 32},
        "data": {"train": data_glob},
        "train": {"steps": steps, "save_interval": 10, "checkpoint_dir": ckpt,
                  "collective_timeout": 20, "rendezvous_timeout": 60},
    }
    if snapshot > 0:
        job["snapshot"] = {"enabled": True, "interval": snapshot, "dir": shm}
    with open(path, "w") as f:
        json.dump(job, f)


def losses(workdir, name):
    out = {}
    path = os.path.join(workdir, "runs", name, "metrics.csv")
    with open(path) as f:
        next(f)
        for line in f:
            parts = line.split(",")
            if len(parts) > 1 and parts[0].isdigit():
                out[int(parts[0])] = float(parts[1])
    return out


class Nodes:
    def __init__(self, zerod, workdir, job, port, min_nodes, max_nodes, settle, max_restarts):
        self.zerod, self.workdir, self.job, self.port = zerod, workdir, job, port
        self.range = f"{min_nodes}:{max_nodes}"
        self.settle = settle
        self.max_restarts = max_restarts
        self.procs = {}  # node rank -> Popen
        self.starts = 0

    def start(self, rank):
        self.starts += 1
        log = open(os.path.join(self.workdir, f"node{rank}.{self.starts}.log"), "w")
        self.procs[rank] = subprocess.Popen(
            [self.zerod, "train", self.job, "--nnodes", self.range, "--node-rank", str(rank),
             "--master", f"127.0.0.1:{self.port}", "--settle", str(self.settle),
             "--max-restarts", str(self.max_restarts)],
            cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT)
        return log.name

    def live(self):
        return sorted(r for r, p in self.procs.items() if p.poll() is None)

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            p.wait()


def all_logs(workdir):
    """Every agent's log (each with its workers' output) as one, its lines in time order (each
    starts with [HH:MM:SS.mmm]; a line without one stays after the line before it)."""
    names = sorted(f for f in os.listdir(workdir) if re.match(r"node\d+\.\d+\.log$", f))
    lines = []
    for f in names:
        stamp = ""
        for i, line in enumerate(open(os.path.join(workdir, f), errors="replace")):
            m = re.match(r"\[(\d\d:\d\d:\d\d\.\d+)\]", line)
            if m:
                stamp = m.group(1)
            lines.append((stamp, f, i, line.rstrip("\n")))
    lines.sort()
    return "\n".join(x[3] for x in lines)


def step_of(workdir):
    m = re.findall(r"\[rank 0\] step +(\d+)/", all_logs(workdir))
    return max(int(x) for x in m) if m else 0


def analyse(log):
    """Failures, takeovers, joins and the steps each failure lost, from every agent's log in time
    order. The hosting agent logs each round's end once (a takeover logs the lost host's round
    end); rank 0 of the next round's workers logs its restore once: with snapshots it says the
    steps lost; without, they are the newest step trained less the step resumed from."""
    failures, joins, takeovers, lost = 0, 0, 0, []
    pending, last_step = None, 0
    for line in log.splitlines():
        m = re.search(r"\[rank 0\] step +(\d+)/", line)
        if m:
            last_step = max(last_step, int(m.group(1)))
        if "took the rendezvous over at epoch" in line:
            takeovers += 1
        if re.search(r"elastic: epoch \d+ ends: .*\(restart ", line):
            failures += 1
            pending = "failure"
        elif re.search(r"elastic: epoch \d+ ends: .*waiting to join", line):
            joins += 1
            pending = "join"
        m = re.search(r"\[rank 0\] elastic: restored step \d+ .*?; (\d+) step\(s\) lost", line)
        if m and pending:
            if pending == "failure":
                lost.append(int(m.group(1)))
            pending = None
            continue
        m = re.search(r"\[rank 0\] resumed from \S+ \(step (\d+)", line)
        if m and pending:
            if pending == "failure":
                lost.append(last_step - int(m.group(1)))
            pending = None
    return failures, takeovers, joins, lost


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--zerod", required=True)
    ap.add_argument("--workdir", default="elastic-soak")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--interval", type=float, default=60, help="seconds between disturbances")
    ap.add_argument("--min-nodes", type=int, default=2)
    ap.add_argument("--max-nodes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-restarts", type=int, default=1000)
    ap.add_argument("--tolerance", type=float, default=1e-4, help="relative, final loss")
    ap.add_argument("--snapshot", type=int, default=2, help="in-memory snapshot interval (0: none)")
    ap.add_argument("--spare-node0", action="store_true", help="never kill node 0")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    zerod = os.path.abspath(a.zerod)
    work = os.path.abspath(a.workdir)
    os.makedirs(work, exist_ok=True)
    env_threads = {"OMP_NUM_THREADS": "1"}
    os.environ.update(env_threads)
    # The demo corpus as shards (one step of the demo job writes them).
    demo = os.path.join(work, "demo")
    if not os.path.isdir(os.path.join(demo, "data")):
        subprocess.run([zerod, "train", "--steps", "1", "--demo-dir", demo], cwd=work, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    glob = os.path.join(demo, "data", "demo_train_*.bin")

    run = os.path.join(work, f"run{int(time.time())}")
    os.makedirs(run)
    shm = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else run, f"zerod-soak-{os.getpid()}")
    write_job(os.path.join(run, "soak.json"), glob, "ckpt", 10**9, "soak.json", a.snapshot, shm)
    nodes = Nodes(zerod, run, "soak.json", free_port(), a.min_nodes, a.max_nodes, 1.0,
                  a.max_restarts)
    events = []
    killed = set()  # node ranks whose agent this script killed (not restarted since)
    t0 = time.time()
    try:
        for r in range(a.max_nodes):
            nodes.start(r)
        next_event = t0 + a.interval * rng.uniform(0.5, 1.5)
        while time.time() - t0 < a.minutes * 60:
            time.sleep(0.5)
            ended = [(r, p.returncode) for r, p in nodes.procs.items()
                     if p.poll() is not None and r not in killed]
            if ended:
                events.append((time.time() - t0, f"agents exited on their own: {ended}", step_of(run)))
                print(events[-1], flush=True)
                break
            if time.time() < next_event:
                continue
            next_event = time.time() + a.interval * rng.uniform(0.5, 1.5)
            live = nodes.live()
            others = [r for r in live if r != 0 or not a.spare_node0]
            if others and (len(live) > a.min_nodes or rng.random() < 0.2) and \
                    (len(live) == a.max_nodes or rng.random() < 0.5):
                victim = rng.choice(others)
                nodes.procs[victim].kill()
                nodes.procs[victim].wait()
                killed.add(victim)
                events.append((time.time() - t0, f"kill -9 node {victim}", step_of(run)))
            else:
                free = [r for r in range(a.max_nodes) if r not in live]
                if free:
                    r = rng.choice(free)
                    nodes.start(r)
                    killed.discard(r)
                    events.append((time.time() - t0, f"start node {r}", step_of(run)))
            print(f"{events[-1][0]:7.1f} s  {events[-1][1]} (step {events[-1][2]})", flush=True)
        # The end: SIGTERM to every live agent, an agreed-step save, exit 0.
        for r in nodes.live():
            nodes.procs[r].send_signal(signal.SIGTERM)
        codes = {r: p.wait(timeout=120) for r, p in nodes.procs.items() if r not in killed}
    finally:
        nodes.kill_all()
        subprocess.run(["rm", "-rf", shm])
    log = all_logs(run)
    got = losses(run, "soak.json")
    final_step = max(got)
    failures, takeovers, joins, lost = analyse(log)

    # Undisturbed: MAX nodes of the same job to the same step.
    ref = os.path.join(work, f"ref{int(time.time())}")
    os.makedirs(ref)
    write_job(os.path.join(ref, "soak.json"), glob, "ckpt", final_step, "soak.json")
    port = free_port()
    ps = [subprocess.Popen([zerod, "train", "soak.json", "--nnodes", str(a.max_nodes),
                            "--node-rank", str(r), "--master", f"127.0.0.1:{port}"],
                           cwd=ref, stdout=open(os.path.join(ref, f"n{r}.log"), "w"),
                           stderr=subprocess.STDOUT) for r in range(a.max_nodes)]
    try:
        ref_codes = [p.wait(timeout=3600) for p in ps]
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
    want = losses(ref, "soak.json")
    rel = abs(got[final_step] - want[final_step]) / abs(want[final_step])
    report = {
        "minutes": round((time.time() - t0) / 60, 1),
        "disturbances": len(events),
        "kills": sum(1 for e in events if e[1].startswith("kill")),
        "kills_of_node_0": sum(1 for e in events if e[1] == "kill -9 node 0"),
        "failures_survived": failures,
        "rendezvous_takeovers": takeovers,
        "joins_admitted": joins,
        "steps_lost_per_failure": lost,
        "steps_lost_total": sum(lost),
        "final_step": final_step,
        "final_loss": got[final_step],
        "undisturbed_final_loss": want[final_step],
        "relative_difference": rel,
        "agent_exit_codes": codes,
        "undisturbed_exit_codes": ref_codes,
        "workdir": run,
    }
    print(json.dumps(report, indent=1))
    ok = (codes and all(c == 0 for c in codes.values()) and all(c == 0 for c in ref_codes)
          and rel <= a.tolerance)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
