#!/usr/bin/env bash
# Tokenizer throughput, zerod against Hugging Face tokenizers on the same thread count
# (tools/bench/tokenizer_bench.py). Uses the venv tests/tokenizer/parity_test.sh makes under
# the build directory (made here when missing).
#   tools/bench/tokenizer_bench.sh [THREADS]      (default: all cores)
# ZEROD_BUILD_DIR=DIR: an already configured build directory (default ./build).
set -euo pipefail
cd "$(dirname "$0")/../.."
threads=${1:-$(nproc)}
build=${ZEROD_BUILD_DIR:-build}
[[ -d "$build" ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target zerod_tokenizer_probe >/dev/null
venv="$build/tokenizer-venv"
if ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "tokenizers==0.23.3"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" tools/bench/tokenizer_bench.py "$build/tests/zerod_tokenizer_probe" "$PWD" \
  "$work" "$threads"
