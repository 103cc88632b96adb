#!/usr/bin/env bash
# Builds the GPU binaries HERE (the CPU machine, with nvcc) so that a device call need not spend
# its minutes compiling: build_and_test.sh --build-only, then the five programs a device session
# runs (zerod, zerod_gpu_bench, zerod_attention_bench, zerod_cublaslt_probe and the three GPU test binaries), stripped, with the OpenMP runtime
# they link, packed into tools/device/prebuilt/bin.tar.xz (ignored by git). Carry
# tools/device/prebuilt alone (it holds deps.tar.xz too); tools/device/session.sh unpacks and uses them, and
# builds on the node instead when they do not run there.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
tools/device/gather.sh >/dev/null
tools/device/build_and_test.sh --build-only >/tmp/zerod-prebuild.log 2>&1 || { tail -30 /tmp/zerod-prebuild.log; exit 1; }
b="${BUILD_DIR:-build-device}"
stage="$(mktemp -d)"
mkdir -p "$stage/lib"
for t in zerod zerod_gpu_bench zerod_attention_bench zerod_cublaslt_probe zerod_test_kernels_cuda zerod_test_train_cuda zerod_test_comm_nccl; do
  f="$(find "$b" -name "$t" -type f -perm -u+x | head -1)"
  [[ -n "$f" ]] || { echo "prebuild: $t was not built"; exit 1; }
  strip -o "$stage/$t" "$f"
done
gomp="$(ldd "$stage/zerod_test_train_cuda" | awk '/libgomp/{print $3}')"
[[ -z "$gomp" ]] || cp -L "$gomp" "$stage/lib/"
# The CUPTI timeline library (session.sh's trace phase) and the libcupti it was linked with.
tr="$(find "$b" -name libzerod_cupti_trace.so -type f | head -1)"
if [[ -n "$tr" ]]; then
  strip -o "$stage/lib/libzerod_cupti_trace.so" "$tr"
  cupti="$(ldd "$tr" | awk '/libcupti/{print $3}')"
  [[ -z "$cupti" ]] || cp -L "$cupti" "$stage/lib/"
fi
# Every library the programs need must be on the GPU node: the carried deps, the CUDA toolkit and
# NCCL, the C/C++/OpenMP runtimes (a library found only on this machine, such as oneDNN, made a
# device call's binaries unusable once).
missing="$(for f in "$stage"/zerod_*; do ldd "$f"; done | awk '$2 == "=>" {print $1, $3}' |
  grep -vE "tools/device/deps|$stage/lib|^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|libgomp|libcublasLt|libcublas|libcudart|libnccl|libpcre2-8)\.so" |
  sort -u || true)"
if [[ -n "$missing" ]]; then
  echo "prebuild: the GPU programs need libraries the device node lacks:"; echo "$missing"; exit 1
fi
mkdir -p tools/device/prebuilt
tar -C "$stage" -cJf tools/device/prebuilt/bin.tar.xz .
rm -rf "$stage"
# The Debian libraries too, packed (46 MB unpacked, about 6 MB as xz: the device tool carries 64 MiB).
tar -C tools/device -cJf tools/device/prebuilt/deps.tar.xz deps
du -sh tools/device/prebuilt/*
