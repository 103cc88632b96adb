#!/usr/bin/env bash
# tools/plot/plot.sh renders two runs' metrics.csv to PNG files, and refuses bad input with
# exit code 2.
set -uo pipefail
plot="$1/tools/plot/plot.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for run in a b; do
  mkdir -p "$dir/runs/$run"
  {
    echo "step,loss,lr,grad_norm,loss_scale,tokens_per_s,mfu,skipped,val_loss"
    for s in $(seq 1 40); do
      val=""
      (( s % 10 == 0 )) && val="2.5"
      echo "$s,$(awk -v s="$s" 'BEGIN { print 5 - s / 10 }'),0.001,1.0,1,$((1000 + s)),0.3,0,$val"
    done
  } > "$dir/runs/$run/metrics.csv"
done

"$plot" --out "$dir/png" "$dir/runs/a" "$dir/runs/b/metrics.csv" || fail "plot exited $?"
for f in loss tokens; do
  png="$dir/png/$f.png"
  [[ -s "$png" ]] || fail "$png missing or empty"
  [[ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" == "89504e470d0a1a0a" ]] || fail "$png is not a PNG"
  (( $(stat -c %s "$png") > 5000 )) || fail "$png is suspiciously small"
done

"$plot" >/dev/null 2>&1; [[ $? -eq 2 ]] || fail "no run: expected exit 2"
"$plot" "$dir/nowhere" >/dev/null 2>&1; [[ $? -eq 2 ]] || fail "missing run: expected exit 2"
echo "step,loss,lr" > "$dir/empty.csv"
"$plot" "$dir/empty.csv" >/dev/null 2>&1; [[ $? -eq 2 ]] || fail "empty csv: expected exit 2"
printf 'a,b\n1,2\n' > "$dir/other.csv"
"$plot" "$dir/other.csv" >/dev/null 2>&1; [[ $? -eq 2 ]] || fail "foreign csv: expected exit 2"
echo "plot test passed"
