#!/usr/bin/env bash
# The CPU training benchmark of issue 2: zerod against a plain PyTorch implementation of the
# same model (Debian's python3-torch), same threads, same run. Prints both and the ratio.
#   tools/bench/train_bench.sh [--steps N] [--warmup N]
# Environment is left as the user has it (e.g. OPENBLAS_CORETYPE): both sides run under it.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/deps.sh --bench
tools/build.sh >/dev/null
threads=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads

echo "== zerod"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
build/tools/bench/zerod_train_bench "$@" --json | tee "$out"
zerod_json=$(tail -n 1 "$out")
echo "== PyTorch (same shape, fp32, AdamW, $threads threads)"
torch_json=$(/usr/bin/python3 tools/bench/torch_gpt.py --threads "$threads" --json "$@")
echo "$torch_json"
/usr/bin/python3 - "$zerod_json" "$torch_json" <<'PY'
import json, sys
z, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"== result: zerod {z['tokens_per_s']:.0f} tokens/s vs PyTorch {t['torch']} {t['tokens_per_s']:.0f} tokens/s"
      f" -> ratio {z['tokens_per_s'] / t['tokens_per_s']:.2f}x")
print(f"   zerod achieves {z['gflops']:.0f} GFLOP/s; sgemm 2048^3 in the same run: ours {z['sgemm_ours_2048']:.0f},"
      f" OpenBLAS {z['sgemm_openblas_2048']:.0f} GFLOP/s")
PY
