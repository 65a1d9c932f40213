#!/usr/bin/env bash
# The GPU check, run on a machine with an NVIDIA GPU from the repository root with deps/ beside
# it (see scripts/gather-deps.sh): builds GoogleTest into /tmp/prefix, configures and builds
# minamp for sm_90, launches the GEMM kernels once (rebuilt without compressing the machine code if
# the driver refuses it: first_launch in scripts/gpu-build.sh), reads the GEMM kernels' machine code
# (bench/gemm_sass.py: each version's main loop, no local-memory LDL/STL), runs the whole test
# binary (a skipped GPU test fails it), then compute-sanitizer memcheck on the GPU tests and
# racecheck on the GEMM and reduction tests.
# Full logs go to ${OUT:-/tmp/minamp-gpu}: setup.log (device, GoogleTest, configure), build.log
# (build, first launch, SASS), sass.json (the SASS figures), tests.log, memcheck.log,
# racecheck.log and extra.log — seven files at most, all in one folder.
# Every stage runs and is recorded even when an earlier one failed; each has a time limit, cut so
# that all of them stay within $TIME_LIMIT_S seconds (default 560: under ten minutes), so the
# summary always prints. A pass/fail table ends the output and the exit status is
# non-zero when any stage failed or timed out. The build folder is $BUILD (default build-gpu);
# CUDA_HOME (default /usr/local/cuda) has its bin/ appended to PATH. ONLY (e.g. ONLY=racecheck)
# names the check stages to run, of sass, tests, memcheck and racecheck (default: all), and
# lifts their own time limits (the run's limit alone bounds them): a second run in the same build
# folder (nothing to rebuild) can so give a stage that the first run cut short the whole limit;
# the stages not named are listed as not run.
#
#   bash scripts/gpu-check.sh [COMMAND [ARG...]]
#
# COMMAND with its arguments, if given, runs afterwards as one more stage, from the repository
# root, its output in extra.log; files it writes belong outside $OUT (which keeps the six logs),
# packed into one archive there, e.g.
#   scripts/gpu-check.sh bash -c 'build-gpu/sine --compare --out /tmp/sine &&
#     tar -czf "$OUT/sine.tgz" -C /tmp sine'
# shellcheck disable=SC2317 # the stage functions run through run_stage (bash -c)
set -uo pipefail
# -h/--help prints the comment above; a first argument starting with '-' is no COMMAND. Later
# arguments are COMMAND's own (scripts/gpu-check.sh build-gpu/sine --help runs sine --help).
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/args.sh" # usage, check_names
# shellcheck source=scripts/gpu-build.sh
source "$(dirname "$0")/gpu-build.sh" # build_googletest, configure_gpu_build, first_launch
case ${1-} in
-h | --help) usage; exit 0 ;;
-*) echo "gpu-check: unknown option '$1' (see: bash $0 --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.." || exit 1

out=${OUT:-/tmp/minamp-gpu}
build=${BUILD:-build-gpu}
gtest_prefix=/tmp/prefix
export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
mkdir -p "$out"

run_limit=${TIME_LIMIT_S:-560}
stage_names=()
stage_results=()
check_stages="sass tests memcheck racecheck"
only=${ONLY:-$check_stages}
check_names gpu-check ONLY "$check_stages" "$only"

# run_stage NAME LOG SECONDS COMMAND...: runs COMMAND with its output appended to $out/LOG under
# a time limit (cut to what is left of the run's limit, less 10 s for the summary; killed 10 s after
# the TERM if still there), shows the stage's output and records pass, fail, timeout or
# unavailable (compute-sanitizer refusing the device, as on gVisor machines) with the time taken.
run_stage() {
  local name=$1 log=$out/$2 limit=$3
  shift 3
  local left=$((run_limit - 10 - SECONDS)) start=$SECONDS rc
  [ "$left" -lt "$limit" ] && limit=$left
  stage_names+=("$name")
  if [[ " $check_stages " == *" ${name%% *} "* && -n ${ONLY-} ]]; then
    if [[ " $only " != *" ${name%% *} "* ]]; then
      stage_results+=("not run (ONLY=$only), 0 s")
      return
    fi
    limit=$left # a stage named in ONLY has the run's limit for itself
  fi
  if [ "$limit" -le 0 ]; then
    stage_results+=("SKIPPED (time limit reached)")
    return
  fi
  echo "== $name (limit $limit s, log: $log)"
  local stage_log=${TMPDIR:-/tmp}/minamp-stage.log
  echo "== $name" >>"$log"
  timeout -k 10 "$limit" bash -c '"$@"' stage "$@" 2>&1 | tee "$stage_log" >>"$log"
  rc=${PIPESTATUS[0]}
  tail -n 15 "$stage_log"
  local result=pass
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && result="TIMEOUT after $limit s"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && result="FAIL (exit $rc)"
  grep -q "Device not supported" "$stage_log" &&
    result="UNAVAILABLE (compute-sanitizer: Device not supported; unverified)"
  stage_results+=("$result, $((SECONDS - start)) s")
}

# The whole test binary; on the GPU machine a skipped GPU test (other than GpuAbsent.*, which
# needs no device) means the GPU was not usable, which fails the stage instead of passing it.
run_tests() {
  "$build/minamp_tests" --gtest_output="json:/tmp/minamp-tests.json" || return 1
  python3 - /tmp/minamp-tests.json <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
skipped = [f"{suite['name']}.{test['name']}" for suite in report["testsuites"]
           for test in suite["testsuite"] if test.get("result") == "SKIPPED"
           and suite["name"].startswith("Gpu") and suite["name"] != "GpuAbsent"]
if skipped:
    sys.exit(f"{len(skipped)} GPU tests skipped (first: {skipped[0]}): is the GPU usable?")
EOF
}
# The large batch-norm test takes minutes under the sanitizers, and the examples (other processes)
# run kernels the GPU tests check; both run in the plain test stage. So does the out-of-memory
# test: the cudaMalloc failure it provokes on purpose is an API error to memcheck.
# MINAMP_CUDA_EXACT_ALLOC: every tensor in a block of its exact size, freed at once (the cache
# would hide a kernel reading past a tensor or into a freed one; see cuda/device.cu).
memcheck() {
  MINAMP_CUDA_EXACT_ALLOC=1 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$build/minamp_tests" \
    --gtest_filter='Gpu*:-GpuBatchNorm.Large*:GpuExamples.*:GpuAllocator.OutOfMemory*'
}
racecheck() {
  compute-sanitizer --tool racecheck --error-exitcode 1 "$build/minamp_tests" \
    --gtest_filter='GpuGemm*:GpuConv*:GpuNormalizedConv*:GpuReduce*:GpuLoss*:GpuBatchNorm.Small*:GpuColumnMoments.ThinK*:GpuColumnMoments.ManyRowTiles'
}

# The SASS of the GEMM objects: for each tensor-core GEMM version, bench/gemm_sass.py reads the
# main loop of its 4096^3 kernel (HMMA count, other instructions per HMMA, LDSM/LDS, LDGSTS) and
# its registers and blocks per SM, and fails when a kernel is missing or touches local memory
# (spills); the fp32 SIMT object must not touch local memory either.
sass() {
  local failed=0 counts
  "$build/bench_gemm" --kernels >/tmp/minamp-kernels.json &&
    python3 bench/gemm_sass.py --kernels /tmp/minamp-kernels.json \
      --objects "$build/CMakeFiles/minamp.dir/cuda" --json "$out/sass.json" || failed=1
  counts=$(cuobjdump --dump-sass "$build/CMakeFiles/minamp.dir/cuda/gemm_fp32.cu.o" |
    grep -oE '\b(LDL|STL)[A-Z0-9.]*' | cut -d. -f1 | sort | uniq -c | tr '\n' ' ')
  [ -n "$counts" ] && echo "gemm_fp32 uses local memory: $counts" && failed=1
  return "$failed"
}

export build gtest_prefix out
export -f build_googletest configure_gpu_build first_launch run_tests memcheck racecheck sass
rm -f "$out"/{setup,build,tests,memcheck,racecheck,extra}.log "$out"/sass.json
run_stage "device" setup.log 30 nvidia-smi -L
run_stage "googletest build" setup.log 120 build_googletest
run_stage "configure" setup.log 60 configure_gpu_build
run_stage "build" build.log 300 cmake --build "$build" -j16
run_stage "first launch" build.log 330 first_launch cmake --build "$build" -j16
run_stage "sass (GEMM objects)" build.log 30 sass
run_stage "tests" tests.log 150 run_tests
run_stage "memcheck (Gpu*)" memcheck.log 200 memcheck
run_stage "racecheck (GEMM, reductions)" racecheck.log 150 racecheck
[ $# -gt 0 ] && run_stage "extra: $*" extra.log 600 "$@"

echo
echo "== summary (logs in $out)"
failed=0
for i in "${!stage_names[@]}"; do
  printf '  %-34s %s\n' "${stage_names[$i]}" "${stage_results[$i]}"
  [[ ${stage_results[$i]} == pass* || ${stage_results[$i]} == "not run"* ]] || failed=1
done
exit "$failed"
