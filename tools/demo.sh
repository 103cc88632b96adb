#!/usr/bin/env bash
# Installs what is missing, builds, and trains the built-in demo job (`zerod train` with no
# job file): a small byte-level GPT on a corpus made of this project's own text files.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
tools/build.sh >/dev/null
exec build/engine/zerod train "$@"
