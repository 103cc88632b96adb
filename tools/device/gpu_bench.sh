#!/usr/bin/env bash
# The GPU benchmark on the GPU node: GPT-2 124M training throughput (tokens/s) and MFU of the
# PyTorch baseline (tools/device/gpu_bench.py, the node's python3 with its PyTorch), then of
# zerod's GPU trainer if it is built (build-device/tools/bench/zerod_gpu_bench, made by
# tools/device/build_and_test.sh once that target exists).
#   tools/device/gpu_bench.sh [gpu_bench.py flags...]   e.g. --batch 32 --steps 50
# Environment: PYTHON (default python3), BUILD_DIR (default build-device), ZEROD_GPU_BENCH_ARGS
# (flags for zerod_gpu_bench), OUT (if set: pytorch_bench.json, zerod_bench.json land there).
# Each side prints one JSON line; a last table compares them. Exits non-zero only if the PyTorch
# side (or a zerod binary that exists) fails.
set -euo pipefail

die() { echo "gpu_bench: $*" >&2; exit 1; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
build="${BUILD_DIR:-build-device}"
[[ "$build" = /* ]] || build="$root/$build"
out="${OUT:-}"
command -v "$py" >/dev/null || die "$py not found"

echo "== gpu_bench: PyTorch baseline ($("$py" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo 'torch missing'))"
pt_json="$(PYTHONUNBUFFERED=1 "$py" tools/device/gpu_bench.py "$@")" || die "the PyTorch benchmark failed"
pt_json="$(tail -1 <<<"$pt_json")"
echo "$pt_json"
[[ -z "$out" ]] || echo "$pt_json" >"$out/pytorch_bench.json"

bin="$build/tools/bench/zerod_gpu_bench"
zd_json=""
if [[ -x "$bin" ]]; then
  echo "== gpu_bench: zerod ($bin ${ZEROD_GPU_BENCH_ARGS:-})"
  D="$root/tools/device/deps/usr"
  # The Debian libraries carried in deps/ and the NCCL that build_and_test.sh linked.
  export LD_LIBRARY_PATH="$D/lib/x86_64-linux-gnu:$D/lib:$D/lib/x86_64-linux-gnu/openblas-pthread:$build/nccl-root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # shellcheck disable=SC2086  # the flags are meant to split
  zd_out="$("$bin" ${ZEROD_GPU_BENCH_ARGS:-})" || die "zerod_gpu_bench failed"
  echo "$zd_out"
  zd_json="$(grep '^{' <<<"$zd_out" | tail -1 || true)"
  [[ -z "$out" || -z "$zd_json" ]] || echo "$zd_json" >"$out/zerod_bench.json"
else
  echo "== gpu_bench: zerod GPU training not built yet ($bin absent)"
fi

# Side by side (tokens/s, MFU) when both printed JSON.
"$py" - "$pt_json" "$zd_json" <<'EOF' || true
import json, sys
rows = []
for s in sys.argv[1:]:
    if s.strip():
        d = json.loads(s)
        rows.append((d.get("impl", "?"), d.get("micro_batch", "?"), d.get("tokens_per_s", 0), d.get("mfu", 0)))
print(f"{'impl':<10}{'micro-batch':>12}{'tokens/s':>14}{'MFU':>8}")
for impl, b, tps, mfu in rows:
    print(f"{impl:<10}{b!s:>12}{tps:>14,.0f}{mfu:>8.1%}")
EOF
