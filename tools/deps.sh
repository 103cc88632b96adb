#!/usr/bin/env bash
# Installs the Debian packages zerod builds with, if any is missing. Idempotent and
# non-interactive; does nothing (and needs no network) when everything is present.
#   tools/deps.sh            build + test dependencies
#   tools/deps.sh --bench    also the reference benchmark's (python3-torch)
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libopenblas-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev
  libgtest-dev libgmock-dev
  libgloo-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  openssl  # the TLS test makes a self-signed certificate
  prometheus-cpp-dev
  gnuplot-nox  # tools/plot
  libaio-dev fio  # offload/aio; fio: the aio benchmark's baseline
  python3-torch python3-venv  # tests/hf: parity with transformers (in a venv over this torch);
                              # torchrun for tests/e2e/launchers_test.cc
  munge slurmctld slurmd slurm-client  # launchers_test.cc starts a one-node Slurm cluster
  libpcre2-dev libsentencepiece-dev  # engine/tokenizer: tokenizer.json regexes, .model files
  libutf8proc-dev  # engine/tokenizer: the Unicode normalizers (NFC: Qwen2, NFKC, NFD, NFKD)
  python3-sentencepiece  # tests/tokenizer: the reference for libsentencepiece (same version)
  zlib1g-dev libzstd-dev  # zerod-shards: .gz and .zst inputs
  libdnnl-dev  # kernels/cpu/onednn: bf16 matrix products on AVX512-BF16 / AMX CPUs
  ocl-icd-opencl-dev opencl-headers  # Debian's dnnl-config.cmake requires OpenCL
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-torch python3-numpy)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "deps: missing packages (${missing[*]}) and not root; install them and re-run" >&2
    exit 2
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet: update once, then install.
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/zerod-apt.log 2>&1; then
  $SUDO apt-get update -q >>/tmp/zerod-apt.log 2>&1 || true
  if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/zerod-apt.log 2>&1; then
    tail -20 /tmp/zerod-apt.log >&2
    echo "deps: apt-get install failed (log: /tmp/zerod-apt.log)" >&2
    exit 1
  fi
fi
echo "deps: done"
