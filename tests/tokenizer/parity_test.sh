#!/usr/bin/env bash
# Tokenizer parity: makes (once) a venv over Debian's python3 with Hugging Face tokenizers from
# PyPI, then runs tests/tokenizer/parity.py: it trains its own tokenizers on a corpus of this
# project's text and generated Unicode (no downloads of models) and holds zerod_tokenizer_probe's
# ids and text against the Python libraries'.
# The sentencepiece reference is Debian's python3-sentencepiece, the Python binding of the very
# libsentencepiece zerod links: PyPI's sentencepiece is a newer library (0.2.x against Debian
# 12's 0.1.97) that breaks ties between equal-scoring unigram segmentations differently (62 of
# 2,725 texts of this corpus).
#   parity_test.sh BUILD_DIR
# Exits 0 when every text matches; a machine without access to PyPI (when the venv is not there
# yet) fails with the reason, it does not skip.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "$1" && pwd)"
venv="$build/tokenizer-venv"
tokenizers_version="0.23.3"
if ! /usr/bin/python3 -c 'import sentencepiece' 2>/dev/null; then
  echo "parity_test: /usr/bin/python3 has no sentencepiece (Debian python3-sentencepiece; tools/deps.sh installs it)" >&2
  exit 1
fi
if ! "$venv/bin/python" -c "
import sys, tokenizers
sys.exit(tokenizers.__version__ != '$tokenizers_version')
" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "tokenizers==$tokenizers_version"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" "$here/parity.py" "$build/tests/zerod_tokenizer_probe" "$work" "$here/../.."
