#!/usr/bin/env bash
# The CPU training benchmark of issue 2: zerod against a plain PyTorch implementation of the
# same model (Debian's python3-torch), same threads, same run. Prints both and the ratio.
#   tools/bench/train_bench.sh [--model gpt2|llama] [--steps N] [--warmup N] [shape flags]
# --model gpt2 (the default): tools/bench/torch_gpt.py, a plain PyTorch GPT-2 of the same shape.
# --model llama: the Llama bench shape against transformers' LlamaForCausalLM (eager attention,
#   tools/bench/torch_llama.py), run in a venv over Debian's python3-torch with transformers
#   from PyPI, made once under the build directory (bench-venv).
# Environment is left as the user has it (e.g. OPENBLAS_CORETYPE): both sides run under it.
# ZEROD_BUILD_DIR=DIR uses an already configured build directory and builds only
# zerod_train_bench there (default: tools/build.sh builds everything into ./build).
#   tools/bench/train_bench.sh --baselines [...]: against current PyTorch (eager, torch.compile,
#   fp32 and bf16 autocast) and DeepSpeed, zerod fp32 and bf16: tools/bench/train_baselines.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ "${1:-}" == --baselines ]]; then
  shift
  exec tools/bench/train_baselines.sh "$@"
fi
model=gpt2
prev=""
for a in "$@"; do
  case "$a" in
    --model=*) model=${a#--model=} ;;
    *) if [[ "$prev" == "--model" ]]; then model=$a; fi ;;
  esac
  prev=$a
done
case "$model" in
  gpt2 | llama) ;;
  *) echo "train_bench: --model $model: expected gpt2 or llama" >&2; exit 2 ;;
esac
tools/deps.sh --bench
if [[ -n "${ZEROD_BUILD_DIR:-}" ]]; then
  build=$ZEROD_BUILD_DIR
  cmake --build "$build" --target zerod_train_bench >/dev/null
else
  build=build
  tools/build.sh >/dev/null
fi
threads=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads

python=/usr/bin/python3
torch_script=tools/bench/torch_gpt.py
torch_name="PyTorch"
if [[ "$model" == llama ]]; then
  # transformers is not packaged for Debian 12: a venv over its python3-torch (as tests/hf does).
  venv="$build/bench-venv"
  transformers_version="4.46.3"  # the newest transformers that supports Debian 12's torch 1.13
  if ! "$venv/bin/python" -c "import transformers, sys; sys.exit(transformers.__version__ != '$transformers_version')" 2>/dev/null; then
    echo "== making $venv (transformers $transformers_version over /usr/bin/python3's torch)"
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "transformers==$transformers_version"
  fi
  python="$venv/bin/python"
  torch_script=tools/bench/torch_llama.py
  torch_name="PyTorch (transformers LlamaForCausalLM eager)"
fi

echo "== zerod"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$build/tools/bench/zerod_train_bench" "$@" --json | tee "$out"
zerod_json=$(tail -n 1 "$out")
if [[ "$model" == llama ]]; then
  echo "== $torch_name (same shape, fp32, AdamW, $threads threads)"
else
  echo "== PyTorch (same shape, fp32, AdamW, $threads threads)"
fi
torch_json=$("$python" "$torch_script" --threads "$threads" --json "$@")
echo "$torch_json"
"$python" - "$model" "$zerod_json" "$torch_json" <<'PY'
import json, sys
model, z, t = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
if model == "llama":
    print(f"== result: zerod {z['tokens_per_s']:.0f} tokens/s vs PyTorch (transformers LlamaForCausalLM eager)"
          f" {t['tokens_per_s']:.0f} tokens/s -> ratio {z['tokens_per_s'] / t['tokens_per_s']:.2f}x"
          f"   [torch {t['torch']}, transformers {t['transformers']}]")
    if t.get("compiled_tokens_per_s"):
        c = t["compiled_tokens_per_s"]
        print(f"   vs torch.compile: {c:.0f} tokens/s -> ratio {z['tokens_per_s'] / c:.2f}x")
    else:
        print(f"   compiled baseline: {t['compiled_note']}")
else:
    print(f"== result: zerod {z['tokens_per_s']:.0f} tokens/s vs PyTorch {t['torch']} {t['tokens_per_s']:.0f} tokens/s"
          f" -> ratio {z['tokens_per_s'] / t['tokens_per_s']:.2f}x")
print(f"   zerod achieves {z['gflops']:.0f} GFLOP/s; sgemm 2048^3 in the same run: ours {z['sgemm_ours_2048']:.0f},"
      f" OpenBLAS {z['sgemm_openblas_2048']:.0f} GFLOP/s")
PY
