#!/usr/bin/env bash
# CPU bf16 against fp32, in the same run: zerod_train_bench on one shape in three modes,
# alternating rounds (fp32, bf16 with bf16 matrix products, bf16 storage with fp32 products
# via ZEROD_CPU_BF16_GEMM=0), then each mode's median tokens/s and the ratios
# bf16 / fp32 and bf16 / bf16-storage-only. Exit 1 when the bf16 products were not used (the
# log line says why: a CPU without avx512_bf16, or zerod built without oneDNN).
#   tools/bench/cpu_bf16_bench.sh [--rounds N] [zerod_train_bench shape flags]
# ZEROD_BUILD_DIR=DIR uses an already configured build directory (default ./build).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3
args=()
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
build=${ZEROD_BUILD_DIR:-build}
cmake --build "$build" --target zerod_train_bench >/dev/null
bench="$build/tools/bench/zerod_train_bench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((r = 1; r <= rounds; ++r)); do
  for mode in fp32 bf16 bf16-storage; do
    dtype=${mode%-storage}
    gemm=1; [[ "$mode" == bf16-storage ]] && gemm=0
    ZEROD_CPU_BF16_GEMM=$gemm "$bench" --dtype "$dtype" --json "${args[@]}" >"$tmp/$mode.$r.log" 2>&1
    tail -n 1 "$tmp/$mode.$r.log" >"$tmp/$mode.$r.json"
    { grep -h "^bf16 on the CPU" "$tmp/$mode.$r.log" || true; } | head -1 >>"$tmp/notes"
    echo "round $r $mode: $(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["tokens_per_s"]))' "$tmp/$mode.$r.json") tokens/s"
  done
done
python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
med = {m: statistics.median(json.load(open(f"{tmp}/{m}.{r}.json"))["tokens_per_s"] for r in range(1, rounds + 1))
       for m in ("fp32", "bf16", "bf16-storage")}
notes = sorted(set(open(f"{tmp}/notes").read().split("\n")) - {""})
for n in notes: print("  " + n)
print(f"== median of {rounds}: fp32 {med['fp32']:.0f}, bf16 {med['bf16']:.0f}, "
      f"bf16 storage + fp32 products {med['bf16-storage']:.0f} tokens/s")
print(f"== bf16 / fp32 = {med['bf16'] / med['fp32']:.2f}x; bf16 / bf16-storage = {med['bf16'] / med['bf16-storage']:.2f}x")
used = any("matrix products on bf16 operands" in n for n in notes)
sys.exit(0 if used else 1)
PY
