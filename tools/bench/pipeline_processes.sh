#!/bin/bash
# Pipeline schedules as real processes (issue 22 item 6): `zerod train --nproc-per-node P` on one
# machine (Gloo over 127.0.0.1, one process per stage), each schedule in turn over the same data,
# and one process (P=1) as the baseline. Prints per setting the median over the steps after the
# first of the step line's tokens/s and measured bubble (`| bubble X%`), the formula
# (P-1)/(P-1+M), and the ratios to P=1 and to 1F1B; 1f1b@action and interleaved@action run with
# ZEROD_PIPELINE_PREFETCH=0 (each receive posted at its action), the baseline of posting ahead.
#
#   tools/bench/pipeline_processes.sh [ZEROD] [ROUNDS]      (env: LAYERS EMBD SEQ BATCH M P STEPS)
#
# The data is the built-in demo corpus (byte vocabulary), written once by `zerod train` under
# $WORK/demo. Quiet machine wanted. zerod gives each rank cores / ranks threads, so P=1 runs
# one process on every core and the pipeline one single-thread process per stage: the ratio to
# P=1 is at the same cores.
set -euo pipefail
ZEROD=${1:-build/engine/zerod}
ROUNDS=${2:-2}
LAYERS=${LAYERS:-8} EMBD=${EMBD:-256} SEQ=${SEQ:-256} BATCH=${BATCH:-2} M=${M:-8} P=${P:-2}
STEPS=${STEPS:-6}
WORK=${WORK:-/tmp/zerod_pipeline_processes}
mkdir -p "$WORK"
if ! ls "$WORK"/demo/data/demo_train_*.bin >/dev/null 2>&1; then
  # The demo job writes its data first; stop it once the data is there.
  "$ZEROD" train --demo-dir "$WORK/demo" >"$WORK/demo.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    ls "$WORK"/demo/data/demo_train_*.bin >/dev/null 2>&1 && break
    sleep 0.5
  done
  sleep 1
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
fi
job() {  # job NAME PIPELINE SCHEDULE V
  cat >"$WORK/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": $BATCH, "gradient_accumulation_steps": $M,
 "model": {"n_layer": $LAYERS, "n_head": 4, "n_embd": $EMBD, "vocab_size": 256, "seq_len": $SEQ},
 "parallelism": {"pipeline": $2, "pipeline_schedule": "$3", "virtual_stages": $4},
 "data": {"train": "$WORK/demo/data/demo_train_*.bin"},
 "train": {"steps": $STEPS}, "steps_per_print": 1}
JSON
}
job p1 1 1f1b 1
job gpipe "$P" gpipe 1
job 1f1b "$P" 1f1b 1
job zero_bubble "$P" zero_bubble 1
job interleaved "$P" interleaved_1f1b 2
: >"$WORK/steps.txt"
for r in $(seq 1 "$ROUNDS"); do
  for s in p1 gpipe 1f1b zero_bubble interleaved 1f1b@action interleaved@action; do
    n=$P
    [ "$s" = p1 ] && n=1
    # NAME@action: ZEROD_PIPELINE_PREFETCH=0, each receive posted at its action (the runner before
    # it posted receives ahead), the baseline of that change.
    pre=2
    [ "${s#*@}" = action ] && pre=0
    ZEROD_PIPELINE_PREFETCH=$pre "$ZEROD" train "$WORK/${s%@action}.json" --nproc-per-node "$n" 2>&1 |
      awk -v s="$s" '/\| step [0-9]+\// || / step [0-9]+\// {
        if ($0 ~ / step 1\//) next
        tok = ""; bub = "-"
        n = split($0, f, "|")
        for (i = 1; i <= n; ++i) {
          if (f[i] ~ /tok\/s/) { split(f[i], a, " "); tok = a[1] }
          if (f[i] ~ /bubble/) { split(f[i], a, " "); bub = a[2]; sub("%", "", bub) }
        }
        if (tok != "") print s, tok, bub }' >>"$WORK/steps.txt"
  done
done
python3 - "$WORK/steps.txt" "$P" "$M" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
P, M = int(sys.argv[2]), int(sys.argv[3])
def med(s, k):
    v = [float(r[k]) for r in rows if r[0] == s and r[k] != "-"]
    return statistics.median(v) if v else float("nan")
formula = (P - 1) / (P - 1 + M)
base, one = med("p1", 1), med("1f1b", 1)
print(f"{'setting':>12} {'tokens/s':>9} {'vs P=1':>7} {'vs 1f1b':>8} {'bubble':>7} {'formula':>8} steps")
for s in ["p1", "gpipe", "1f1b", "zero_bubble", "interleaved", "1f1b@action",
          "interleaved@action"]:
    n = sum(1 for r in rows if r[0] == s)
    b = med(s, 2)
    f = formula / (2 if s.startswith("interleaved") else 1)
    print(f"{s:>12} {med(s, 1):>9.0f} {med(s, 1) / base:>7.2f} {med(s, 1) / one:>8.3f} "
          + (f"{b / 100:>7.3f} {f:>8.3f}" if s != "p1" else f"{'-':>7} {'-':>8}") + f" {n}")
print(f"result: 1f1b bubble {med('1f1b', 2) / 100:.3f} against {formula:.3f}; zero_bubble "
      f"{med('zero_bubble', 2) / 100:.3f}; interleaved {med('interleaved', 2) / 100:.3f} "
      f"(processes, P = {P}, M = {M})")
print(f"result: receives posted ahead against at their actions: 1f1b bubble "
      f"{med('1f1b', 2) / 100:.3f} vs {med('1f1b@action', 2) / 100:.3f}, tokens/s "
      f"{med('1f1b', 1) / med('1f1b@action', 1):.3f}x; interleaved bubble "
      f"{med('interleaved', 2) / 100:.3f} vs {med('interleaved@action', 2) / 100:.3f}, tokens/s "
      f"{med('interleaved', 1) / med('interleaved@action', 1):.3f}x")
PY
