#!/usr/bin/env bash
# Parity with Hugging Face transformers: makes (once) a venv over Debian's python3-torch with
# transformers from PyPI, then runs tests/hf/parity.py (forward and gradients, zerod_hf_probe),
# tests/hf/moe_parity.py (Mixtral: forward, gradients, aux loss, 20 training steps, export)
# tests/hf/train_parity.py (20 steps of `zerod train` against a PyTorch loop; eval, export and
# from_pretrained of its checkpoint), tests/hf/generate_parity.py (`zerod generate` against
# transformers' generate) and tests/hf/tokenizer_roundtrip.py (a job's data.tokenizer from
# zerod-shards to checkpoint, eval sample, generate --prompt and AutoTokenizer on the export).
#   parity_test.sh BUILD_DIR
# Exits 0 when every case matches; a machine without python3-torch or without access to PyPI
# (when the venv is not there yet) fails with the reason, it does not skip.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "$1" && pwd)"
venv="$build/hf-venv"
transformers_version="4.46.3"  # the newest transformers that supports Debian 12's torch 1.13
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "parity_test: /usr/bin/python3 has no torch (Debian python3-torch; tools/deps.sh installs it)" >&2
  exit 1
fi
if ! "$venv/bin/python" -c "import transformers, sys; sys.exit(transformers.__version__ != '$transformers_version')" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "transformers==$transformers_version"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$venv/bin/python" "$here/parity.py" "$build/tests/zerod_hf_probe" "$work"
"$venv/bin/python" "$here/moe_parity.py" "$build/tests/zerod_hf_probe" "$build/engine/zerod" \
  "$build/tools/zeroctl/zeroctl" "$work/moe"
"$venv/bin/python" "$here/train_parity.py" "$build/engine/zerod" "$build/tools/zeroctl/zeroctl" \
  "$work/train"
"$venv/bin/python" "$here/generate_parity.py" "$build/engine/zerod" "$work/generate"
"$venv/bin/python" "$here/tokenizer_roundtrip.py" "$build/engine/zerod" "$build/tools/zeroctl/zeroctl" \
  "$build/tools/shards/zerod-shards" "$work/tokenizer"
