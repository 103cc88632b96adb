#!/usr/bin/env bash
# tools/device/session.sh's test phase on stand-in gtest binaries (no GPU): a test that crashes
# and one that hangs are each named, and the binary is rerun from the test after them, so the
# tests behind a bad one still run and the junit tarball holds every run's xml; a binary that
# finishes normally runs once. Also tools/device/ncu_summary.py on a fixed Nsight Compute CSV.
#   tests/tools/device_session_test.sh REPO_ROOT
set -uo pipefail
root="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
[[ -n "${KEEP:-}" ]] && trap - EXIT
fail() { echo "FAIL: $*"; exit 1; }

# A stand-in for a gtest binary: --gtest_list_tests, --gtest_filter=A:B..., --gtest_output=xml:F.
# Test A.two segfaults, A.three hangs, the others pass.
mkdir -p "$tmp/bin" "$tmp/out"
cat >"$tmp/bin/zerod_test_kernels_cuda" <<'STUB'
#!/usr/bin/env bash
filter="" xml=""
for a in "$@"; do
  case "$a" in
    --gtest_list_tests) printf 'A.\n  one\n  two  # GetParam() = 1\n  three\nB/C.\n  four/0\n'; exit 0 ;;
    --gtest_filter=*) filter="${a#--gtest_filter=}" ;;
    --gtest_output=xml:*) xml="${a#--gtest_output=xml:}" ;;
  esac
done
echo "<testsuites tests=\"1\"/>" >"$xml"
for t in ${filter//:/ }; do
  echo "[ RUN      ] $t"
  [[ "$t" == A.two ]] && kill -SEGV $$
  [[ "$t" == A.three ]] && exec sleep 600
  echo "[       OK ] $t (0 ms)"
done
echo "[==========] tests ran. (0 ms total)"
echo "[  PASSED  ] $(wc -w <<<"${filter//:/ }") tests."
STUB
cp "$tmp/bin/zerod_test_kernels_cuda" "$tmp/bin/zerod_test_train_cuda"
# zerod_test_train_cuda: every test passes (A.two and A.three renamed away).
sed -i 's/== A.two/== never/; s/== A.three/== never/' "$tmp/bin/zerod_test_train_cuda"
chmod +x "$tmp"/bin/*

start=$SECONDS
OUT="$tmp/out" SESSION_BIN="$tmp/bin" STALL=3 \
  bash "$root/tools/device/session.sh" --phases tests --deadline 120 >"$tmp/log" 2>&1 ||
  fail "session.sh exited $? ($(tail -5 "$tmp/log"))"
((SECONDS - start < 60)) || fail "took $((SECONDS - start)) s: the hang was not cut at the stall limit"
log="$tmp/log"
grep -q 'zerod_test_kernels_cuda: A.two DID NOT FINISH (exit 139: crash)' "$log" || fail "the crash is not named"
grep -q 'zerod_test_kernels_cuda: A.three DID NOT FINISH (exit 124: timeout)' "$log" || fail "the hang is not named"
grep -q '\[       OK \] B/C.four/0' "$log" || fail "the test after the hang did not run"
[[ "$(grep -c '^=== session .* zerod_test_kernels_cuda run' "$log")" == 3 ]] || fail "expected 3 runs of the failing binary"
[[ "$(grep -c '^=== session .* zerod_test_train_cuda run' "$log")" == 1 ]] || fail "expected 1 run of the passing binary"
grep -q 'zerod_test_train_cuda: .* DID NOT FINISH' "$log" && fail "a passing binary was reported as dying"
grep -q 'session: zerod_test_comm_nccl not built' "$log" || fail "a missing binary is not reported"
tar -tzf "$tmp/out/junit.tar.gz" >"$tmp/list" || fail "no junit.tar.gz"
for f in zerod_test_kernels_cuda.0.xml zerod_test_kernels_cuda.1.xml zerod_test_kernels_cuda.2.xml \
         zerod_test_train_cuda.0.xml died.txt; do
  grep -qx "$f" "$tmp/list" || fail "$f is not in junit.tar.gz ($(tr '\n' ' ' <"$tmp/list"))"
done
grep -q 'DID NOT FINISH' "$tmp/out/session.log" || fail "session.log under OUT lacks the run"

# The abench and variants phases: the fastest forward and (dQ, dK/dV) pair of the attention
# bench's JSON replace "best" in BENCH_ENVS, each entry's variables reach the bench together, and
# its step line is printed.
cat >"$tmp/bin/zerod_attention_bench" <<'STUB'
#!/usr/bin/env bash
while (($#)); do [[ "$1" == --json ]] && json="$2"; shift; done
cat >"$json" <<'J'
{"results": [{"kernel": "forward", "variant": 0, "ms": 0.4}, {"kernel": "forward", "variant": 2, "ms": 0.3},
 {"kernel": "backward", "dq_variant": 0, "dkdv_variant": 0, "ms": 1.3},
 {"kernel": "backward", "dq_variant": 1, "dkdv_variant": 3, "ms": 1.1},
 {"kernel": "backward", "dq_variant": 4, "dkdv_variant": 1, "ms": 1.2}]}
J
STUB
cat >"$tmp/bin/zerod_gpu_bench" <<'STUB'
#!/usr/bin/env bash
echo "env ${ZEROD_ATTENTION_MMA:-unset} ${ZEROD_LAYERNORM_FUSED_GRADS:-unset}" >&2
printf '{"step_ms_median": 70.123, "tokens_per_s": 467000.4, "mfu": 0.40049}\n'
STUB
chmod +x "$tmp"/bin/*
OUT="$tmp/out2" SESSION_BIN="$tmp/bin" BENCH_ENVS="ZEROD_ATTENTION_MMA=best+ZEROD_LAYERNORM_FUSED_GRADS=0 ZEROD_ATTENTION_MMA=0,0,0" \
  bash "$root/tools/device/session.sh" --phases abench,variants --batch 4 --deadline 120 >"$tmp/log2" 2>&1 ||
  fail "session.sh (variants) exited $? ($(tail -5 "$tmp/log2"))"
grep -q 'fastest variants in attention_bench.json: 2,1,3' "$tmp/log2" || fail "best variants: $(cat "$tmp/log2")"
grep -q '^env 2,1,3 0$' "$tmp/log2" || fail "the best entry's variables did not reach the bench"
grep -q '^env 0,0,0 unset$' "$tmp/log2" || fail "the second entry did not run alone"
[[ "$(grep -c '^step_ms_median 70.12 tokens_per_s 467000 mfu 0.4005$' "$tmp/log2")" == 2 ]] ||
  fail "the step lines: $(grep step_ms "$tmp/log2")"

# ncu_summary.py: mixed units, thousands separators, templated kernels in anonymous namespaces.
python3 "$root/tools/device/ncu_summary.py" "$root/tests/tools/fixtures/ncu_sample.csv" \
  --json "$tmp/p.json" >"$tmp/summary" || fail "ncu_summary.py failed"
python3 - "$tmp/p.json" <<'PY' || fail "ncu_summary.py's totals"
import json, sys
d = json.load(open(sys.argv[1]))
k = {e["kernel"]: e for e in d["kernels"]}
assert abs(d["total_us"] - 2739.56) < 1e-6, d["total_us"]
fwd = k["mma_forward_kernel<__nv_bfloat16, 64>"]
assert fwd["launches"] == 2 and abs(fwd["total_us"] - 2734.56) < 1e-6, fwd
assert d["kernels"][0]["kernel"] == "mma_forward_kernel<__nv_bfloat16, 64>"
assert abs(k["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"]["total_us"] - 5.0) < 1e-9
PY
grep -q '^all kernels *3 *2739.6$' "$tmp/summary" || fail "the summary's total line: $(tail -1 "$tmp/summary")"
echo "device_session_test: ok"
