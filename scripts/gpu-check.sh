#!/usr/bin/env bash
# The GPU check, run ON the GPU machine from the repository root with deps/ carried (see
# scripts/gather-deps.sh): builds GoogleTest into /tmp/prefix, configures and builds minamp for
# sm_90, runs the whole test binary (GPU tests included), then compute-sanitizer memcheck on the
# GPU tests and racecheck on the GEMM and reduction tests. Full logs go to ${OUT:-/tmp/minamp-gpu}.
# Every stage runs and is recorded even when an earlier one failed; a pass/fail table ends the
# output and the exit status is non-zero when any stage failed.
#
# Extra arguments are run afterwards as one more stage, from the repository root, e.g.
#   scripts/gpu-check.sh build-gpu/sine --compare --out "$OUT/sine"
set -uo pipefail
cd "$(dirname "$0")/.."

out=${OUT:-/tmp/minamp-gpu}
build=${BUILD:-build-gpu}
gtest_prefix=/tmp/prefix
export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
mkdir -p "$out"

stage_names=()
stage_results=()

# run_stage NAME LOG COMMAND...: runs COMMAND with its output in $out/LOG, shows the log's tail
# and records pass or fail with the time taken.
run_stage() {
  local name=$1 log=$out/$2
  shift 2
  echo "== $name (log: $log)"
  local start=$SECONDS rc
  "$@" >"$log" 2>&1
  rc=$?
  tail -n 15 "$log"
  local result=pass
  [ "$rc" -eq 0 ] || result="FAIL (exit $rc)"
  stage_names+=("$name")
  stage_results+=("$result, $((SECONDS - start)) s")
}

build_googletest() {
  cmake -S deps/googletest -B /tmp/googletest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$gtest_prefix" &&
    cmake --build /tmp/googletest-build -j16 &&
    cmake --install /tmp/googletest-build
}

configure() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMINAMP_CUDA_ARCHS=90 \
    -DCMAKE_PREFIX_PATH="$PWD/deps/prefix;$gtest_prefix"
}

# The large batch-norm test takes minutes under the sanitizers; it runs in the plain test stage.
run_tests() { "$build/minamp_tests" --gtest_output="json:$out/tests.json"; }
memcheck() {
  compute-sanitizer --tool memcheck --error-exitcode 1 "$build/minamp_tests" \
    --gtest_filter='Gpu*:-GpuBatchNorm.Large*'
}
racecheck() {
  compute-sanitizer --tool racecheck --error-exitcode 1 "$build/minamp_tests" \
    --gtest_filter='GpuGemm*:GpuConv*:GpuReduce*:GpuLoss*:GpuBatchNorm.Small*'
}

run_stage "device" device.log nvidia-smi -L
run_stage "googletest build" googletest.log build_googletest
run_stage "configure" configure.log configure
run_stage "build" build.log cmake --build "$build" -j16
run_stage "tests" tests.log run_tests
run_stage "memcheck (Gpu*)" memcheck.log memcheck
run_stage "racecheck (GEMM, reductions)" racecheck.log racecheck
[ $# -gt 0 ] && run_stage "extra: $*" extra.log "$@"

echo
echo "== summary (logs in $out)"
failed=0
for i in "${!stage_names[@]}"; do
  printf '  %-34s %s\n' "${stage_names[$i]}" "${stage_results[$i]}"
  [[ ${stage_results[$i]} == pass* ]] || failed=1
done
exit "$failed"
