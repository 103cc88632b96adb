#!/usr/bin/env bash
# Renders the metrics.csv of one or more runs (csv_monitor) to PNG with gnuplot:
#   OUT/loss.png     training loss vs step (validation loss as points), one line per run
#   OUT/tokens.png   tokens/s vs step
#
#   tools/plot/plot.sh [--out DIR] RUN...     RUN: a metrics.csv, or a directory holding one
#
# Exit 2 on bad input (no run given, a run without metrics.csv, an empty file).
set -euo pipefail

out="."
runs=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) runs+=("$1"); shift ;;
  esac
done
if [[ ${#runs[@]} -eq 0 ]]; then
  echo "plot: give at least one run (a metrics.csv or a directory with one); see --help" >&2
  exit 2
fi
command -v gnuplot >/dev/null || { echo "plot: gnuplot is missing (tools/deps.sh installs it)" >&2; exit 2; }

files=()
names=()
for r in "${runs[@]}"; do
  f="$r"
  [[ -d "$r" ]] && f="$r/metrics.csv"
  if [[ ! -f "$f" ]]; then
    echo "plot: $r: no metrics.csv there (csv_monitor.enabled writes OUTPUT_PATH/JOB_NAME/metrics.csv)" >&2
    exit 2
  fi
  if [[ $(wc -l < "$f") -lt 2 ]]; then
    echo "plot: $f: no steps in it" >&2
    exit 2
  fi
  if [[ "$(head -1 "$f")" != step,loss,lr,* ]]; then
    echo "plot: $f: not a zerod metrics.csv (header: $(head -1 "$f"))" >&2
    exit 2
  fi
  files+=("$f")
  names+=("$(basename "$(dirname "$(realpath "$f")")")")
done
mkdir -p "$out"

# Columns: step,loss,lr,grad_norm,loss_scale,tokens_per_s,mfu,skipped,val_loss
plot_cmd() {  # $1: column expression, $2: "lines" or "points"
  local sep="" cmd=""
  for i in "${!files[@]}"; do
    cmd+="$sep'${files[$i]}' using 1:$1 with $2 title '${names[$i]}'"
    sep=", "
  done
  echo "$cmd"
}
val_cmd() {
  local cmd=""
  for i in "${!files[@]}"; do
    cmd+=", '${files[$i]}' using 1:(\$9 > 0 ? \$9 : 1/0) with points pt 7 title '${names[$i]} (val)'"
  done
  echo "$cmd"
}

gnuplot <<GP
set datafile separator ","
set key autotitle columnhead
set terminal pngcairo size 1000,600 noenhanced
set grid
set xlabel "step"
set output "$out/loss.png"
set title "training loss"
set ylabel "loss"
plot $(plot_cmd 2 lines)$(val_cmd)
set output "$out/tokens.png"
set title "throughput"
set ylabel "tokens/s"
plot $(plot_cmd 6 lines)
GP
echo "plot: $out/loss.png $out/tokens.png (${#files[@]} run$([[ ${#files[@]} -eq 1 ]] || echo s))"
