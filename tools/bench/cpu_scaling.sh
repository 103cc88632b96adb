#!/usr/bin/env bash
# The CPU scaling curve of issue 21 item 5: zerod_train_bench on the bench shape (4 layers,
# seq 256, micro-batch 4, vocabulary 50257, fp32, AdamW) at each thread count and width (heads
# = width / 64, so the head size stays 64; 768 is GPT-2 small's width), one run each: tokens/s,
# GFLOP/s, peak RSS of the whole process (VmHWM) against the planner's bytes for the job
# (weights + gradients + optimizer + activations + ZeRO buffers, engine/plan/planner.h), and
# against the planner plus what the process holds before main runs (code and libraries).
# Prints a markdown table and writes the rows as JSON.
#   tools/bench/cpu_scaling.sh [--threads 1,2] [--widths 256,512,768] [--steps 4] [--warmup 1]
#                              [--out build/cpu_scaling.json] [-- extra zerod_train_bench flags]
# ZEROD_BUILD_DIR=DIR: the configured build directory (default ./build); zerod_train_bench is
# built there first.
set -euo pipefail
cd "$(dirname "$0")/../.."
threads_list=1,2
widths=256,512,768
steps=4
warmup=1
build=${ZEROD_BUILD_DIR:-build}
out=$build/cpu_scaling.json
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads_list=$2; shift 2 ;;
    --widths) widths=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "cpu_scaling: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for w in ${widths//,/ }; do
  if ! [[ "$w" =~ ^[0-9]+$ ]] || (( w % 64 != 0 || w == 0 )); then
    echo "cpu_scaling: --widths $widths: $w is not a positive multiple of 64 (head size 64)" >&2
    exit 2
  fi
done
for t in ${threads_list//,/ }; do
  if ! [[ "$t" =~ ^[1-9][0-9]*$ ]]; then
    echo "cpu_scaling: --threads $threads_list: $t is not a positive integer" >&2
    exit 2
  fi
done
cmake --build "$build" --target zerod_train_bench >/dev/null
bench=$build/tools/bench/zerod_train_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# tools/bench/cpu_scaling.sh --threads $threads_list --widths $widths --steps $steps --warmup $warmup ${extra[*]}"
for t in ${threads_list//,/ }; do
  for w in ${widths//,/ }; do
    OMP_NUM_THREADS=$t "$bench" --steps "$steps" --warmup "$warmup" --embd "$w" \
      --heads $((w / 64)) "${extra[@]}" --json >"$tmp/run-$t-$w.log" 2>&1 ||
      { echo "zerod_train_bench threads $t width $w failed:" >&2; tail -n 20 "$tmp/run-$t-$w.log" >&2; exit 1; }
    grep '^{' "$tmp/run-$t-$w.log" | tail -n 1 |
      /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); r["width"]=int(sys.argv[1]); r["heads"]=int(sys.argv[1])//64; print(json.dumps(r))' "$w" \
      >"$tmp/row-$t-$w.json"
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
mkdir -p "$(dirname "$out")"
/usr/bin/python3 - "$out" "$tmp"/row-*.json <<'PY'
import json, sys
rows = [json.load(open(p)) for p in sys.argv[2:]]
rows.sort(key=lambda r: (r["threads"], r["width"]))
print("| threads | width | heads | params | tokens/s | GFLOP/s | peak RSS MiB | planner MiB "
      "| RSS / planner | at start MiB | RSS / (planner + start) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    p = r["predicted_mib"]
    print(f"| {r['threads']} | {r['width']} | {r['heads']} | {r['params'] / 1e6:.1f}M "
          f"| {r['tokens_per_s']:.0f} | {r['gflops']:.1f} | {r['peak_rss_mib']:.0f} | {p:.0f} "
          f"| {r['peak_rss_mib'] / p:.3f} | {r['rss_start_mib']:.0f} "
          f"| {r['peak_rss_mib'] / (p + r['rss_start_mib']):.3f} |")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
print(f"# rows written to {sys.argv[1]}")
PY
