#!/usr/bin/env bash
# Builds zerod's training core with CUDA on an air-gapped GPU node and runs the GPU tests.
#
# Run from anywhere inside the repository, on the GPU node, with tools/device/deps carried
# (made on a connected Debian 12 machine by tools/device/gather.sh):
#   tools/device/build_and_test.sh                 training core + GPU tests, run the GPU tests
#   tools/device/build_and_test.sh --all           build everything (no gRPC), run every test
#   tools/device/build_and_test.sh --build-only    configure and build, run nothing
#
# Expects on the node: bash, a C++20 host compiler (g++ >= 12) that nvcc accepts, CMake >= 3.25,
# Ninja, nvcc (PATH, $CUDACXX or /usr/local/cuda/bin/nvcc), the CUDA toolkit's cuBLASLt, an NVIDIA
# driver (nvidia-smi), glibc >= 2.34 and libstdc++ >= GCC 12's (GLIBCXX_3.4.30; what the Debian 12
# libraries in deps/ need), and optionally NCCL: $NCCL_ROOT (with include/nccl.h and lib/libnccl.so*),
# else the pip package nvidia-nccl-cu13 of `python3` (site-packages/nvidia/nccl/{include,lib}, its
# library named libnccl.so.2 only), else /usr. NCCL is handed to CMake as a small folder of links,
# <build>/nccl-root/{include,lib/libnccl.so}, named by -DNCCL_ROOT, -DNCCL_INCLUDE_DIR, -DNCCL_LIBRARY,
# the NCCL_ROOT environment variable and CMAKE_PREFIX_PATH; its lib folder is on LD_LIBRARY_PATH.
#
# Environment: BUILD_DIR (default build-device), JOBS (default nproc), CUDA_ARCH (default 90),
# OUT (if set: gtest XML reports and build.log land there), ALLOW_SKIP=1 (accept tests that skip
# although nvidia-smi sees a GPU), REQUIRE_CUDA=0 (let the build go on without nvcc).
# Exit status: 0 if everything built and no test failed; non-zero otherwise.
set -euo pipefail

die() { echo "build_and_test: $*" >&2; exit 1; }
say() { echo "== build_and_test: $*"; }

mode=gpu
case "${1:-}" in
  "") ;;
  --all) mode=all ;;
  --build-only) mode=build ;;
  *) die "unknown argument '$1' (expected --all or --build-only)" ;;
esac

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
deps="$root/tools/device/deps"
D="$deps/usr"
build="${BUILD_DIR:-build-device}"
[[ "$build" = /* ]] || build="$root/$build"
jobs="${JOBS:-$(nproc)}"
arch="${CUDA_ARCH:-90}"
out="${OUT:-}"
t0=$SECONDS

[[ -f "$deps/.gathered" ]] ||
  die "$deps is missing: run tools/device/gather.sh on a connected Debian 12 machine and carry tools/device/deps"
command -v cmake >/dev/null || die "cmake not found"
command -v ninja >/dev/null || die "ninja not found"
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (c++/g++) found"

# ---- the unpacked Debian libraries ----
libdirs="$D/lib/x86_64-linux-gnu:$D/lib:$D/lib/x86_64-linux-gnu/openblas-pthread"
export CMAKE_PREFIX_PATH="$D${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export CPATH="$D/include${CPATH:+:$CPATH}"
export LIBRARY_PATH="$libdirs${LIBRARY_PATH:+:$LIBRARY_PATH}"
# Needed while building too: gtest_discover_tests runs each test binary after linking it.
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- nvcc ----
nvcc="${CUDACXX:-}"
[[ -n "$nvcc" ]] || nvcc="$(command -v nvcc || true)"
[[ -n "$nvcc" || ! -x /usr/local/cuda/bin/nvcc ]] || nvcc=/usr/local/cuda/bin/nvcc
if [[ -z "$nvcc" ]]; then
  [[ "${REQUIRE_CUDA:-1}" == 0 ]] || die "nvcc not found (PATH, \$CUDACXX, /usr/local/cuda/bin); REQUIRE_CUDA=0 builds without CUDA"
  echo "build_and_test: warning: no nvcc, building without the CUDA backend" >&2
fi

# ---- NCCL ----
nccl_inc="" nccl_libfile=""
nccl_try() {  # $1 include folder, $2 lib folder: accept if both hold NCCL
  local lib
  [[ -f "$1/nccl.h" ]] || return 1
  lib="$(ls "$2"/libnccl.so "$2"/libnccl.so.[0-9]* 2>/dev/null | head -1 || true)"
  [[ -n "$lib" ]] || return 1
  nccl_inc="$1" nccl_libfile="$lib"
}
found=""
if [[ -n "${NCCL_ROOT:-}" ]] && nccl_try "$NCCL_ROOT/include" "$NCCL_ROOT/lib"; then found="NCCL_ROOT"; fi
if [[ -z "$found" ]] && command -v python3 >/dev/null; then
  # nvidia.nccl is a package of the namespace package nvidia: read its __path__, then glob the
  # site-packages folders in case importing it fails.
  while read -r d; do
    [[ -n "$d" ]] || continue
    if nccl_try "$d/include" "$d/lib"; then found="python3 ($d)"; break; fi
  done < <(python3 - 2>/dev/null <<'EOF' || true
import glob, os, site, sys
seen = []
try:
    import nvidia.nccl as m
    seen += list(getattr(m, "__path__", [])) or [os.path.dirname(m.__file__)]
except Exception:
    pass
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
for r in roots:
    seen += glob.glob(os.path.join(r, "nvidia", "nccl")) + glob.glob(os.path.join(r, "nvidia", "cu*", "nccl"))
print("\n".join(dict.fromkeys(seen)))
EOF
  )
fi
if [[ -z "$found" ]]; then
  for d in /usr /usr/local /usr/local/cuda /usr/local/nccl; do
    if nccl_try "$d/include" "$d/lib/x86_64-linux-gnu" || nccl_try "$d/include" "$d/lib64" || nccl_try "$d/include" "$d/lib"; then
      found="$d"; break
    fi
  done
fi
nccl_args=()
if [[ -n "$found" ]]; then
  shim="$build/nccl-root"
  mkdir -p "$shim/lib"
  ln -sfn "$nccl_inc" "$shim/include"
  ln -sfn "$nccl_libfile" "$shim/lib/libnccl.so"
  ln -sfn "$nccl_libfile" "$shim/lib/libnccl.so.2"
  export NCCL_ROOT="$shim"
  export CMAKE_PREFIX_PATH="$shim:$CMAKE_PREFIX_PATH"
  LD_LIBRARY_PATH="$(dirname "$nccl_libfile"):$LD_LIBRARY_PATH"
  nccl_args=(-DNCCL_ROOT="$shim" -DNCCL_INCLUDE_DIR="$shim/include" -DNCCL_LIBRARY="$shim/lib/libnccl.so")
  nccl_ver="$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$nccl_inc/nccl.h" | paste -sd.)"
  say "NCCL ${nccl_ver:-?} from $found: $nccl_inc, $nccl_libfile"
else
  say "NCCL not found (no NCCL_ROOT, no python3 nvidia.nccl, nothing in /usr): NCCL targets will be absent"
fi

# ---- configure ----
mkdir -p "$build"
log="$build/build.log"
: >"$log"
# -rpath-link: libgloo's own needs (hiredis, ibverbs) at link time; --disable-new-dtags: the build
# RPATH (deps' folders) also serves those indirect needs, so the binaries run without LD_LIBRARY_PATH.
rpath_link="-Wl,-rpath-link,$D/lib/x86_64-linux-gnu -Wl,-rpath-link,$D/lib -Wl,--disable-new-dtags"
cuda_args=()
[[ -z "$nvcc" ]] || cuda_args=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$arch")
say "configure $build (Release, no gRPC, CUDA arch ${arch}, deps $deps)"
set -o pipefail
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DZEROD_GRPC=OFF -DZEROD_NATIVE=ON -DZEROD_TESTS=ON \
  -DZEROD_ONEDNN=OFF -DZEROD_PCRE2=OFF -DZEROD_SENTENCEPIECE=OFF -DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON \
  -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH//:/;}" \
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  -DCMAKE_BUILD_RPATH="${libdirs//:/;}" \
  -DCMAKE_EXE_LINKER_FLAGS="$rpath_link" -DCMAKE_SHARED_LINKER_FLAGS="$rpath_link" \
  "${cuda_args[@]}" "${nccl_args[@]}" 2>&1 | tee -a "$log" || die "configure failed (log: $log)"

# The find_package results must come from deps/ (or the node itself for CUDA/NCCL).
for v in fmt_DIR spdlog_DIR nlohmann_json_DIR CLI11_DIR GTest_DIR Gloo_DIR OpenBLAS_DIR ZEROD_LIBAIO ZEROD_LIBAIO_INCLUDE; do
  printf '   %-22s %s\n' "$v" "$(sed -n "s/^$v:[A-Z]*=//p" "$build/CMakeCache.txt")"
done
if ! grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=.\+' "$build/CMakeCache.txt" && [[ "${REQUIRE_CUDA:-1}" != 0 ]]; then
  die "CMake did not enable CUDA (see $log)"
fi

# ---- build ----
all_targets="$(ninja -C "$build" -t targets all | sed -n 's/^\([A-Za-z0-9_.+-]*\): .*/\1/p' | sort -u)"
has() { grep -qxF "$1" <<<"$all_targets"; }
if [[ "$mode" == all ]]; then
  targets=(all)
else
  targets=(zerod)
  # The GPU tests and benchmarks: every test whose name says CUDA, NCCL or GPU, and the bench.
  while read -r t; do targets+=("$t"); done < <(grep -E '^zerod_test_[A-Za-z0-9_]*(cuda|nccl|gpu)[A-Za-z0-9_]*$' <<<"$all_targets" || true)
  has zerod_gpu_bench && targets+=(zerod_gpu_bench)
  has zerod_attention_bench && targets+=(zerod_attention_bench)
  has zerod_cublaslt_probe && targets+=(zerod_cublaslt_probe)
  has zerod_cupti_trace && targets+=(zerod_cupti_trace)
fi
[[ -z "$nvcc" ]] || has zerod_test_kernels_cuda || die "target zerod_test_kernels_cuda missing although CUDA is on"
say "build with ninja -j$jobs: ${targets[*]}"
tb=$SECONDS
set +e  # ninja's progress lines go to the log only
ninja -C "$build" -j "$jobs" "${targets[@]}" 2>&1 | tee -a "$log" | grep -v '^\[[0-9]*/[0-9]*\] '
rc=${PIPESTATUS[0]}
set -e
[[ -z "$out" ]] || cp "$log" "$out/build.log" 2>/dev/null || true
((rc == 0)) || { tail -40 "$log" >&2; die "build failed after $((SECONDS - tb)) s (log: $log)"; }
say "built in $((SECONDS - tb)) s"

# ---- GPU ----
echo
if command -v nvidia-smi >/dev/null; then
  nvidia-smi || true
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
else
  echo "build_and_test: nvidia-smi not found"
  gpus=0
fi
[[ "$mode" != build ]] || { say "done (--build-only) in $((SECONDS - t0)) s"; exit 0; }

# ---- tests ----
status=0
summary=()
if [[ "$mode" == all ]]; then
  say "ctest (all tests)"
  ctest --test-dir "$build" --output-on-failure -j "$jobs" ${out:+--output-junit "$out/ctest.xml"} || status=1
  summary+=("ctest: $([[ $status == 0 ]] && echo passed || echo FAILED)")
else
  mapfile -t tests < <(for t in "${targets[@]}"; do [[ "$t" == zerod_test_* ]] && echo "$t"; done)
  ((${#tests[@]})) || die "no GPU test target was built"
  for t in "${tests[@]}"; do
    exe="$(find "$build" -name "$t" -type f -perm -u+x | head -1)"
    [[ -n "$exe" ]] || { summary+=("$t: executable not found"); status=1; continue; }
    xml="$build/$t.xml"
    [[ -z "$out" ]] || xml="$out/$t.xml"
    say "run $t"
    rc=0
    "$exe" --gtest_output="xml:$xml" --gtest_color=no || rc=$?
    line="$t: exit $rc"
    if [[ -f "$xml" ]]; then
      tests_n="$(sed -n 's/.*<testsuites [^>]*tests="\([0-9]*\)".*/\1/p' "$xml" | head -1)"
      fail_n="$(sed -n 's/.*<testsuites [^>]*failures="\([0-9]*\)".*/\1/p' "$xml" | head -1)"
      skip_n="$(grep -c 'result="skipped"' "$xml" || true)"
      line+=", ${tests_n:-?} tests, ${fail_n:-?} failed, ${skip_n} skipped"
      if ((gpus > 0)) && ((skip_n > 0)) && [[ "${ALLOW_SKIP:-0}" != 1 ]]; then
        line+=" (skips with a GPU present: counted as failure; ALLOW_SKIP=1 accepts)"
        rc=1
      fi
    fi
    ((rc == 0)) || status=1
    summary+=("$line")
  done
fi

echo
say "summary ($((SECONDS - t0)) s in all; GPUs seen by nvidia-smi: $gpus)"
for l in "${summary[@]}"; do echo "   $l"; done
if ((status == 0)); then say "PASS"; else say "FAIL"; fi
exit "$status"
