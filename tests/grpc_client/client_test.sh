#!/usr/bin/env bash
# A scheduler's view of the daemon: a Python gRPC client (grpcio from PyPI, stubs generated from
# proto/zerod.proto with grpcio-tools) drives `zerod serve` through submit -> watch -> checkpoint
# -> stop --checkpoint -> resume -> status and checks every JobStatus field (client_test.py).
#   client_test.sh SOURCE_DIR BUILD_DIR
# Makes (once) a venv under BUILD_DIR over Debian's python3; a machine without access to PyPI
# (when the venv is not there yet) fails with the reason, it does not skip.
set -euo pipefail
src="$(cd "$1" && pwd)"
build="$(cd "$2" && pwd)"
venv="$build/grpc-venv"
grpc_version="1.68.1"
if ! "$venv/bin/python" -c "import grpc, grpc_tools, sys; sys.exit(grpc.__version__ != '$grpc_version')" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "grpcio==$grpc_version" \
    "grpcio-tools==$grpc_version"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/stubs"
"$venv/bin/python" -m grpc_tools.protoc -I "$src/proto" --python_out="$work/stubs" \
  --grpc_python_out="$work/stubs" "$src/proto/zerod.proto"
"$venv/bin/python" "$src/tests/grpc_client/client_test.py" "$build/engine/zerod" "$work"
