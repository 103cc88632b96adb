#!/usr/bin/env bash
# The CPU training benchmark against current PyTorch and DeepSpeed (issue 21), all in one run on
# one shape, same threads and environment:
#   PyTorch eager fp32, torch.compile fp32, eager bf16 autocast, torch.compile bf16 autocast
#   (tools/bench/torch_gpt.py: F.scaled_dot_product_attention, fused AdamW), zerod fp32 and
#   zerod bf16 (zerod_train_bench), alternating in each of --rounds rounds; then DeepSpeed's CPU
#   path (tools/bench/ds_gpt.py, torchrun over Gloo, DS_ACCELERATOR=cpu) at ZeRO stages 0 and 3,
#   worlds 1 and 2, each beside zerod_zero_bench at the same world and stages.
# Prints one table (tokens/s median and spread over the rounds, GFLOP/s, ratios) and writes it as
# JSON (--json-out, default BUILD/bench/train_baselines.json; every run's log beside it in
# BUILD/bench/train_baselines_runs/).
#   tools/bench/train_baselines.sh [--rounds N] [--ds-rounds N] [--no-deepspeed] [--json-out FILE]
#                                  [--steps N] [--warmup N] [shape flags of zerod_train_bench]
# PyTorch and DeepSpeed come from PyPI, pinned, into a venv made once at BUILD/torch-venv (a
# few GB: PyPI's Linux torch wheel brings its CUDA libraries, unused here).
# ZEROD_BUILD_DIR=DIR uses an already configured build directory (default ./build).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3
ds_rounds=""
deepspeed=1
json_out=""
steps=10
warmup=3
shape=()
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --ds-rounds) ds_rounds=$2; shift 2 ;;  # (default: --rounds)
    --no-deepspeed) deepspeed=0; shift ;;
    --json-out) json_out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --dtype | --dtype=* | --model | --model=*)
      echo "train_baselines: $1: the GPT-2 shape runs every mode itself" >&2; exit 2 ;;
    *) shape+=("$1"); shift ;;
  esac
done
build=${ZEROD_BUILD_DIR:-build}
[[ -n "$ds_rounds" ]] || ds_rounds=$rounds
[[ -n "$json_out" ]] || json_out="$build/bench/train_baselines.json"
torch_version=2.15.0
deepspeed_version=0.19.8
venv="$build/torch-venv"
if ! "$venv/bin/python" - "$torch_version" "$deepspeed_version" <<'PY' 2>/dev/null; then
import sys, torch, deepspeed
sys.exit(not (torch.__version__.split("+")[0] == sys.argv[1] and deepspeed.__version__ == sys.argv[2]))
PY
  echo "== making $venv (PyPI torch $torch_version, deepspeed $deepspeed_version)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "torch==$torch_version" numpy
  # deepspeed's setup imports torch: build it against the torch just installed.
  "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation \
    "deepspeed==$deepspeed_version"
fi
if [[ ! -d "$build" ]]; then tools/build.sh >/dev/null; fi
cmake --build "$build" --target zerod_train_bench zerod_zero_bench >/dev/null
threads=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads
py="$venv/bin/python"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/notes"
common=(--steps "$steps" --warmup "$warmup" "${shape[@]}")

declare -A torch_flags=(
  [torch-eager-fp32]="--attention sdpa --adamw fused"
  [torch-compile-fp32]="--attention sdpa --adamw fused --compile"
  [torch-eager-bf16]="--attention sdpa --adamw fused --autocast bf16"
  [torch-compile-bf16]="--attention sdpa --adamw fused --compile --autocast bf16"
)
modes=(torch-eager-fp32 torch-compile-fp32 torch-eager-bf16 torch-compile-bf16 zerod-fp32 zerod-bf16)
for ((r = 1; r <= rounds; ++r)); do
  for mode in "${modes[@]}"; do
    log="$tmp/$mode.$r.log"
    if [[ "$mode" == zerod-* ]]; then
      "$build/tools/bench/zerod_train_bench" --dtype "${mode#zerod-}" --json "${common[@]}" >"$log" 2>&1
    else
      # shellcheck disable=SC2086
      "$py" tools/bench/torch_gpt.py --threads "$threads" --json ${torch_flags[$mode]} "${common[@]}" \
        >"$log" 2>&1
    fi
    tail -n 1 "$log" >"$tmp/$mode.$r.json"
    grep -h "^bf16 on the CPU" "$log" >>"$tmp/notes" || true
    echo "round $r $mode: $("$py" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["tokens_per_s"]))' "$tmp/$mode.$r.json") tokens/s"
  done
done

if ((deepspeed)); then
  port=$((29500 + RANDOM % 400))
  for ((r = 1; r <= ds_rounds; ++r)); do
    for world in 1 2; do
      for stage in 0 3; do
        log="$tmp/ds-w$world-s$stage.$r.log"
        DS_ACCELERATOR=cpu OMP_NUM_THREADS=$((threads / world > 0 ? threads / world : 1)) \
          timeout 1200 "$venv/bin/torchrun" --nproc-per-node "$world" --master-addr 127.0.0.1 \
          --master-port $((port++)) tools/bench/ds_gpt.py --stage "$stage" --json "${common[@]}" \
          >"$log" 2>&1 || { echo "DeepSpeed world $world stage $stage failed:"; tail -n 20 "$log"; exit 1; }
        grep '^{' "$log" | tail -n 1 >"$tmp/ds-w$world-s$stage.$r.json"
        echo "round $r deepspeed world $world stage $stage: $("$py" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["tokens_per_s"]))' "$tmp/ds-w$world-s$stage.$r.json") tokens/s"
      done
      log="$tmp/zero-w$world.$r.log"
      "$build/tools/bench/zerod_zero_bench" --world "$world" --stages 0,3 --comm-bytes 0 \
        "${common[@]}" >"$log" 2>&1 ||
        { echo "zerod_zero_bench world $world failed:"; tail -n 20 "$log"; exit 1; }
      cp "$log" "$tmp/zero-w$world.$r.txt"
      echo "round $r zerod world $world stages 0,3: $(grep -E '^ +[03] +none' "$log" | awk '{printf "%s ", $5}')tokens/s"
    done
  done
fi

mkdir -p "$(dirname "$json_out")"
# Every run's log and JSON line kept beside the table (JSON_OUT without .json, + _runs/).
runs_dir="${json_out%.json}_runs"
rm -rf "$runs_dir" && mkdir -p "$runs_dir" && cp -r "$tmp"/. "$runs_dir"/
"$py" tools/bench/baselines_table.py "$tmp" "$rounds" "$ds_rounds" "$deepspeed" "$json_out" "$threads" \
  "${common[*]}"
