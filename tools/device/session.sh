#!/usr/bin/env bash
# One call of the device tool: everything issue 15 measures, in one go, every log under $OUT.
#
#   tools/device/session.sh [--phases env,tests,bench,sanitize,memory] [--batch B]
#
# Run from the repository root on the GPU node with tools/device/deps carried, and either
# tools/device/prebuilt carried (made here by tools/device/prebuild.sh: the GPU binaries built on
# the CPU machine, stripped) or nothing (then build_and_test.sh --build-only builds them there).
#
# SESSION_BIN=DIR uses the programs in DIR instead (what the CI test of this script does).
# Phases (all by default, in this order; each bounded by `timeout`):
#   env       nvidia-smi, nvcc, driver, torch, glibc: what docs/gpu.md records
#   tests     each GPU gtest binary (kernels_cuda, train_cuda, comm_nccl) with --gtest_output xml;
#             a binary that crashes or hangs is run again from the test after the one that died,
#             so one bad test does not hide the rest
#   bench     zerod_gpu_bench (with --breakdown; --batch B, else its search up to 32)
#   attn      the same with ZEROD_ATTENTION=$ATTN_IMPL (wmma: the previous kernels; mma64), for the ratio
#   abench    zerod_attention_bench: the mma attention kernels' variants, timed, outputs compared
#   lprobe    zerod_cublaslt_probe: cuBLASLt's bias-gradient epilogues against the column sums
#   variants  zerod_gpu_bench under each environment setting of BENCH_ENVS (see the phase)
#   trace     the CUPTI timeline of a few steps (cupti_trace.cc injected): the GPU's idle gaps
#             and what the host did meanwhile (trace_gaps.py); trace_gaps.json, trace.tsv.xz
#   profile   ncu's GPU time of every kernel of one training step, summed per kernel
#             (tools/device/ncu_summary.py)
#   kprof     ncu's sections (speed of light, occupancy, stalls, memory) of the attention kernels
#   torch     the PyTorch baseline eager and torch.compile at zerod's micro-batch
#             (tools/device/gpu_bench.py)
#   sanitize  compute-sanitizer memcheck and racecheck on a short training run on the GPU
#   memory    the largest GPT-2-family model that trains on one GPU with ZeRO-3 + offload
#
# What comes back ($OUT; the device tool returns at most 8 files, so a call runs at most one of
# attn and abench with all the rest): session.log (everything printed), junit.tar.gz (the
# gtest xml and per-binary logs), zerod_bench.json, zerod_$ATTN_IMPL.json, attention_bench.json,
# profile.json, pytorch_eager.json, pytorch_compile.json, sanitizer.log (build.log instead when
# built there).
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
out="${OUT:-/tmp/zerod-session}"
mkdir -p "$out"
exec > >(tee -a "$out/session.log") 2>&1

phases="env,tests,bench,attn,abench,lprobe,variants,trace,profile,kprof,torch,sanitize,memory"
batch=""
deadline=100000  # seconds from the start: later phases are cut short or skipped
while (($#)); do
  case "$1" in
    --phases) phases="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --deadline) deadline="$2"; shift 2 ;;
    *) echo "session: unknown argument $1"; exit 2 ;;
  esac
done
want() {  # phase $1 was asked for, and there is time left for it
  [[ ",$phases," == *",$1,"* ]] || return 1
  ((deadline - SECONDS > 25)) && return 0
  echo "session: no time left for $1"
  return 1
}
lim() { local l=$((deadline - SECONDS - 5)); ((l < $1)) && echo "$l" || echo "$1"; }  # a phase's limit
say() { echo; echo "=== session [$((SECONDS))s] $*"; }
t0=$SECONDS
work=/tmp/zerod-session-work
rm -rf "$work"; mkdir -p "$work"

# deps: carried unpacked (tools/device/deps) or packed (tools/device/prebuilt/deps.tar.xz).
if [[ ! -f "$root/tools/device/deps/.gathered" && -f "$root/tools/device/prebuilt/deps.tar.xz" ]]; then
  tar -C "$root/tools/device" -xJf "$root/tools/device/prebuilt/deps.tar.xz"
fi
D="$root/tools/device/deps/usr"
libdirs="$D/lib/x86_64-linux-gnu:$D/lib:$D/lib/x86_64-linux-gnu/openblas-pthread"

# ---- binaries: prebuilt (carried) if they run here, else build ----
bin=""
pre="$root/tools/device/prebuilt"
if [[ -n "${SESSION_BIN:-}" ]]; then  # a folder of the programs (tests/tools/device_session_test.sh)
  bin="$SESSION_BIN"
elif [[ -f "$pre/bin.tar.xz" ]]; then
  mkdir -p "$work/pre" && tar -C "$work/pre" -xJf "$pre/bin.tar.xz"
  bin="$work/pre"
fi
# cuBLASLt and NCCL: the CUDA toolkit's, else python3's nvidia-* packages.
extra=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && extra+=":$d"
done
while read -r d; do [[ -n "$d" ]] && extra+=":$d"; done < <(python3 - 2>/dev/null <<'EOF'
import glob, site
for r in site.getsitepackages():
    for d in sorted(glob.glob(r + "/nvidia/*/lib")) + sorted(glob.glob(r + "/nvidia/cu*/lib")):
        print(d)
EOF
)
export LD_LIBRARY_PATH="${bin:+$bin/lib:}$libdirs$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if want env; then
  say "env"
  date -u
  nvidia-smi || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
  (command -v nvcc || ls /usr/local/cuda/bin/nvcc) && (nvcc --version || /usr/local/cuda/bin/nvcc --version) | tail -2
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))' || true
  ldd --version | head -1; g++ --version | head -1; cmake --version | head -1; nproc; free -g | head -2
  uname -r
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
fi

if [[ -n "$bin" ]]; then
  if ! "$bin/zerod_test_kernels_cuda" --gtest_list_tests >/dev/null 2>"$work/prebuilt.err"; then
    echo "session: the prebuilt binaries do not run here:"; head -5 "$work/prebuilt.err"
    bin=""
  else
    echo "session: using the prebuilt binaries ($(ls "$bin" | tr '\n' ' '))"
    ldd "$bin/zerod_test_train_cuda" | grep -i "cublas\|nccl\|openblas\|not found" || true
  fi
fi
[[ -z "$bin" && -n "${SESSION_BIN:-}" ]] && { echo "session: SESSION_BIN=$SESSION_BIN does not run"; exit 1; }
if [[ -z "$bin" ]]; then
  say "build (no usable prebuilt binaries)"
  OUT="$out" timeout 420 tools/device/build_and_test.sh --build-only >"$work/build.out" 2>&1
  rc=$?; tail -30 "$work/build.out"; cp "$work/build.out" "$out/build.log" 2>/dev/null
  ((rc == 0)) || { say "build failed (rc $rc)"; exit 1; }
  b="$root/build-device"
  mkdir -p "$work/bin"
  for t in zerod zerod_gpu_bench zerod_attention_bench zerod_test_kernels_cuda zerod_test_train_cuda zerod_test_comm_nccl; do
    f="$(find "$b" -name "$t" -type f -perm -u+x | head -1)"; [[ -n "$f" ]] && ln -sf "$f" "$work/bin/$t"
  done
  bin="$work/bin"
  export LD_LIBRARY_PATH="$b/nccl-root/lib:$LD_LIBRARY_PATH"
fi

# ---- tests: a crash or hang reruns the binary from the next test ----
stall=${STALL:-100}
run_gtest() {  # name, seconds for the whole binary
  local name="$1" limit="$2" exe="$bin/$1" n=0 rc last remaining last_change=$SECONDS
  [[ -x "$exe" ]] || { echo "session: $name not built"; return; }
  "$exe" --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}' >"$work/$name.all"
  cp "$work/$name.all" "$work/$name.todo"
  while [[ -s "$work/$name.todo" ]] && ((n < 8)); do
    local log="$work/$name.$n.log"
    say "$name run $n ($(wc -l <"$work/$name.todo") tests, limit ${limit}s)"
    # A test that prints nothing for $stall seconds is taken as hung.
    "$exe" --gtest_color=no --gtest_output="xml:$work/$name.$n.xml" \
      --gtest_filter="$(paste -sd: "$work/$name.todo")" >"$log" 2>&1 &
    local pid=$! start=$SECONDS printed=0
    rc=""
    while kill -0 "$pid" 2>/dev/null; do
      sleep 1
      local now; now=$(wc -l <"$log")
      ((now > printed)) && { sed -n "$((printed + 1)),${now}p" "$log"; printed=$now; last_change=$SECONDS; }
      if ((SECONDS - ${last_change:-$start} > stall || SECONDS - start > $(lim "$limit"))); then
        kill -9 "$pid" 2>/dev/null; rc=124; echo "session: $name killed (no output for ${stall}s or over ${limit}s)"; break
      fi
    done
    [[ -n "$rc" ]] || { wait "$pid"; rc=$?; }
    sed -n "$((printed + 1)),\$p" "$log"
    echo "session: $name run $n exit $rc"
    ((rc == 0 || rc == 1)) && grep -q '^\[==========\] .* ran\.' "$log" && break
    last="$(grep -E '^\[ RUN +\] ' "$log" | tail -1 | awk '{print $NF}')"
    [[ -n "$last" ]] || break
    echo "session: $name: $last DID NOT FINISH (exit $rc: $( ((rc == 124)) && echo timeout || echo crash))"
    echo "$name.$last exit $rc" >>"$work/died.txt"
    remaining="$(awk -v l="$last" 'f{print} $0==l{f=1}' "$work/$name.todo")"
    printf '%s\n' "$remaining" | sed '/^$/d' >"$work/$name.todo"
    n=$((n + 1))
  done
}
if want tests; then
  say "tests"
  run_gtest zerod_test_kernels_cuda 240
  run_gtest zerod_test_train_cuda 300
  run_gtest zerod_test_comm_nccl 90
  say "test summary"
  for f in "$work"/*.[0-9].log; do
    echo "$(basename "$f"): $(grep -h -E '^\[  (PASSED|SKIPPED|FAILED) +\] [0-9]+ test' "$f" | paste -sd' ')"
  done
  echo "failed tests:"; grep -h -E '^\[  FAILED  \] [A-Za-z].*[^)]$' "$work"/*.log | sort -u
  [[ -f "$work/died.txt" ]] && { echo "died:"; cat "$work/died.txt"; }
  tar -C "$work" -czf "$out/junit.tar.gz" $(cd "$work" && ls *.xml *.log *.txt 2>/dev/null)
fi

if want bench; then
  say "bench: zerod"
  args=(--steps 20 --warmup 5 --breakdown --max-batch 32)
  [[ -n "$batch" ]] && args+=(--batch "$batch")
  timeout -k 5 "$(lim 200)" "$bin/zerod_gpu_bench" "${args[@]}" >"$work/zerod_bench.out"
  echo "session: zerod_gpu_bench exit $?"
  cat "$work/zerod_bench.out"
  grep '^{' "$work/zerod_bench.out" | tail -1 >"$out/zerod_bench.json"
fi
zb="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["micro_batch"])' "$out/zerod_bench.json" 2>/dev/null)"
pb="${batch:-${zb:-32}}"

if want attn; then
  # The same benchmark with other attention kernels (ATTN_IMPL, ZEROD_ATTENTION's values: wmma,
  # the previous tensor-core kernels, by default; mma64, the mma ones on 64-query blocks), for
  # the ratio.
  ai="${ATTN_IMPL:-wmma}"
  say "bench: zerod with ZEROD_ATTENTION=$ai at micro-batch $pb"
  ZEROD_ATTENTION="$ai" timeout -k 5 "$(lim 120)" "$bin/zerod_gpu_bench" --steps 20 --warmup 5 --batch "$pb" \
    --breakdown | tee "$work/zerod_$ai.out" | grep '^{'
  grep '^{' "$work/zerod_$ai.out" | tail -1 >"$out/zerod_$ai.json"
fi

if want abench && [[ -x "$bin/zerod_attention_bench" ]]; then
  # The mma attention kernels' variants against variant 0 (bitwise equal outputs, timed).
  say "abench: zerod_attention_bench at micro-batch $pb"
  timeout -k 5 "$(lim 120)" "$bin/zerod_attention_bench" --batch "$pb" --json "$out/attention_bench.json"
  echo "session: zerod_attention_bench exit $?"
fi

if want lprobe && [[ -x "$bin/zerod_cublaslt_probe" ]]; then
  # cuBLASLt's bias-gradient epilogues (BGRADB, BGRADA, DGELU_BGRAD; bf16 and fp32 bias types)
  # against the plain product + zerod's column sums, at the step's shapes (rows = batch x 1024).
  say "lprobe: zerod_cublaslt_probe at $((pb * 1024)) rows"
  timeout -k 5 "$(lim 90)" "$bin/zerod_cublaslt_probe" --rows "$((pb * 1024))" --json "$out/cublaslt_probe.json"
  echo "session: zerod_cublaslt_probe exit $?"
fi

if want variants; then
  # The training step under each setting of BENCH_ENVS: space-separated entries, each one or more
  # VAR=value joined by '+' (for example "ZEROD_LAYERNORM_FUSED_GRADS=0+ZEROD_ATTENTION_MMA=0,0,0");
  # the value "best" of ZEROD_ATTENTION_MMA is the fastest forward and (dQ, dK/dV) pair of
  # attention_bench.json.
  best="$(python3 - "$out/attention_bench.json" 2>/dev/null <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
f = min((x for x in r if x["kernel"] == "forward"), key=lambda x: x["ms"])
b = min((x for x in r if x["kernel"] == "backward"), key=lambda x: x["ms"])
print(f"{f['variant']},{b['dq_variant']},{b['dkdv_variant']}")
EOF
)"
  echo "session: fastest variants in attention_bench.json: ${best:-none}"
  for entry in ${BENCH_ENVS:-ZEROD_ATTENTION_MMA=0,0,0}; do
    entry="${entry//ZEROD_ATTENTION_MMA=best/ZEROD_ATTENTION_MMA=${best:-0,0,0}}"
    say "variants: zerod_gpu_bench with ${entry//+/ } at micro-batch $pb"
    env ${entry//+/ } timeout -k 5 "$(lim 60)" "$bin/zerod_gpu_bench" --steps 20 --warmup 5 \
      --batch "$pb" | grep '^{' | python3 -c 'import json,sys; d=json.load(sys.stdin); print("step_ms_median", round(d["step_ms_median"],2), "tokens_per_s", round(d["tokens_per_s"]), "mfu", round(d["mfu"],4))'
  done
fi

if want trace; then
  # The timeline of a few training steps from CUPTI (libzerod_cupti_trace.so, injected): where
  # the GPU sits idle inside a step and what the host did meanwhile (tools/device/trace_gaps.py).
  # TRACE_ENV: a VAR=value+VAR=value setting to trace under (as in BENCH_ENVS).
  lib="$(ls "$bin"/lib/libzerod_cupti_trace.so "$bin"/libzerod_cupti_trace.so 2>/dev/null | head -1)"
  if [[ -n "$lib" ]]; then
    say "trace: CUPTI timeline of zerod_gpu_bench at micro-batch $pb ${TRACE_ENV:+with ${TRACE_ENV//+/ }}"
    env ${TRACE_ENV:+${TRACE_ENV//+/ }} CUDA_INJECTION64_PATH="$lib" ZEROD_TRACE_FILE="$work/trace.tsv" \
      timeout -k 5 "$(lim 90)" "$bin/zerod_gpu_bench" --steps 6 --warmup 3 --batch "$pb" | grep '^{' |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print("traced: step_ms_median", round(d["step_ms_median"],2))'
    echo "session: trace $(wc -l <"$work/trace.tsv" 2>/dev/null) records, $(tail -1 "$work/trace.tsv" 2>/dev/null)"
    timeout -k 5 "$(lim 60)" python3 tools/device/trace_gaps.py "$work/trace.tsv" --skip 3 --top 25 \
      --json "$out/trace_gaps.json"
    echo "session: trace_gaps exit $?"
    xz -T4 -3 -c "$work/trace.tsv" >"$out/trace.tsv.xz" 2>/dev/null || true
  else
    echo "session: no libzerod_cupti_trace.so among the programs"
  fi
fi

if want torch; then
  say "bench: PyTorch eager at micro-batch $pb"
  PYTHONUNBUFFERED=1 timeout -k 5 "$(lim 150)" python3 tools/device/gpu_bench.py --batch "$pb" --steps 20 --warmup 5 --no-compile \
    | tee "$work/pt_eager.out"
  tail -1 "$work/pt_eager.out" >"$out/pytorch_eager.json"
  say "bench: PyTorch torch.compile at micro-batch $pb"
  PYTHONUNBUFFERED=1 timeout -k 5 "$(lim 240)" python3 tools/device/gpu_bench.py --batch "$pb" --steps 20 --warmup 8 \
    | tee "$work/pt_compile.out"
  tail -1 "$work/pt_compile.out" >"$out/pytorch_compile.json"
fi

if want profile; then
  nc="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
  if [[ -n "$nc" ]]; then
    say "profile: ncu gpu__time_duration of one training step at micro-batch $pb"
    timeout -k 5 "$(lim 240)" "$nc" --clock-control none --metrics gpu__time_duration.sum --csv \
      --log-file "$work/ncu.csv" "$bin/zerod_gpu_bench" --batch "$pb" --steps 1 --warmup 0 >/dev/null 2>"$work/ncu.err"
    echo "session: ncu exit $?"; tail -3 "$work/ncu.err"
    python3 tools/device/ncu_summary.py "$work/ncu.csv" --top 45 --json "$out/profile.json" | tee "$work/profile.txt"
  else
    echo "session: ncu not found"
  fi
fi

if want kprof; then
  # Nsight Compute's sections for the attention kernels of one training step (KPROF_REGEX, the
  # mma kernels by default; KPROF_COUNT launches): speed of light, occupancy, warp stalls and the
  # memory tables, for the next change to aim at.
  nc="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
  if [[ -n "$nc" ]]; then
    say "kprof: ncu sections of kernels matching ${KPROF_REGEX:-mma_} at micro-batch $pb"
    timeout -k 5 "$(lim 150)" "$nc" --clock-control none --kernel-name "regex:${KPROF_REGEX:-mma_}" \
      --launch-count "${KPROF_COUNT:-3}" --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section LaunchStats "$bin/zerod_gpu_bench" --batch "$pb" --steps 1 --warmup 0 \
      >"$work/kprof.txt" 2>&1
    echo "session: ncu exit $?"
    grep -v '^==PROF==\|^ *$' "$work/kprof.txt" | grep -v '^{' | head -400
  else
    echo "session: ncu not found"
  fi
fi

if want sanitize; then
  cs="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
  if [[ -n "$cs" ]]; then
    # SANITIZE_BIN / SANITIZE_FILTER / SANITIZE_TOOLS: what runs under which tools.
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
      say "compute-sanitizer $tool"
      timeout -k 5 "$(lim 150)" "$cs" --tool "$tool" --error-exitcode 99 "$bin/${SANITIZE_BIN:-zerod_test_train_cuda}" \
        --gtest_filter="${SANITIZE_FILTER:-TrainerCuda.Bf16TracksTheFp32LossCurve}" --gtest_color=no 2>&1 |
        tee -a "$out/sanitizer.log" | tail -25
      echo "session: $tool exit ${PIPESTATUS[0]}"
    done
  else
    echo "session: compute-sanitizer not found"
  fi
fi

if want memory && [[ -x "$bin/zerod_gpu_bench" ]]; then
  # ZeRO-3 + optimizer and parameter offload to CPU memory at growing GPT-2 shapes
  # (MEMORY_SHAPES: "layers:heads:embd ...").
  for shape in ${MEMORY_SHAPES:-24:16:1024 36:20:1280 48:25:1600 48:32:2560}; do
    IFS=: read -r L H E <<<"$shape"
    say "memory: stage 3 + offload_optimizer and offload_param cpu, $L layers, $H heads, $E wide"
    timeout -k 5 "$(lim 120)" "$bin/zerod_gpu_bench" --layers "$L" --heads "$H" --embd "$E" --stage 3 \
      --offload all --dtype bf16 --batch 8 --steps 3 --warmup 1 2>&1 | tail -3
    echo "session: exit ${PIPESTATUS[0]}"
  done
fi

say "done in $((SECONDS - t0)) s"
