#!/usr/bin/env bash
# bench/NOTES.md's open predictions checked on a GPU in one command of under ten minutes, run from
# the repository root with deps/ beside it (scripts/gather-deps.sh). The stages, in order, each
# under a time limit cut to what is left of the run's limit, $TIME_LIMIT_S seconds (default 570):
#   build_sass  scripts/gpu-check.sh with ONLY=sass: GoogleTest, configure, build, first launch and
#               the GEMM kernels' SASS figures (check.txt, sass.json, setup.log, build.log);
#   tests       the GPU tests but the examples and the large batch norm (tests.txt);
#   bench       bench/run-gpu.sh for $MODELS (default: sine classify), until $BENCH_UNTIL_S
#               (default 390) seconds into the run: the square GEMMs, sine in FP32, AMP and
#               AMP-bf16 beside PyTorch's configurations, the model GEMMs (the library and version
#               rows before the sweep's), classify beside PyTorch's, then sine's other seeds and
#               the later stages while time is left (the files in bench/);
#   profile     bench/profile-gpu.sh: every kernel of the fused sine step, and the GEMM loop's
#               stalls (profile.txt, ncu-*.md, ncu-*-csv.tgz);
#   depth       bench_gemm's depth rows (sine's forward GEMM by K, with and without the batch norm
#               hooks, and the sweep's configurations), fitted against K by bench/report.py
#               (depth.txt, depth.json, depth-report.{json,md});
#   persistent  sine's AMP step with v5's large tiles on the persistent grid,
#               MINAMP_GEMM_PERSISTENT=1 (persistent.txt, persistent.json).
# A stage that fails or runs out of time leaves the later ones to run. The stages' files are
# written to ${TMPDIR:-/tmp}/minamp-predictions and packed into ${OUT:-/tmp}/predictions.tgz
# after every stage, so that $OUT holds that one file whatever happens. The output ends with the
# Markdown tables (the benchmark's report, the profiles, the depth rows' fit) and a table of the
# stages (exit status and seconds); the exit status is non-zero when a stage did not pass. COMMIT
# (the measured commit, as in bench/run-gpu.sh), BUILD (default build-gpu), PYTHON (default
# python3) and CUDA_HOME pass to the scripts it runs.
#
#   COMMIT=<sha> bash bench/check-predictions.sh      (no arguments)
# shellcheck disable=SC2317 # the stage functions run through stage (bash -c)
set -uo pipefail
# -h/--help prints the comment above; the script takes no arguments.
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/../scripts/args.sh"
# shellcheck source=scripts/run-names.sh
source "$(dirname "$0")/../scripts/run-names.sh"
no_arguments check-predictions "$@"
cd "$(dirname "$0")/.." || exit 1

out=${OUT:-/tmp}
work=${TMPDIR:-/tmp}/minamp-predictions
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
run_limit=${TIME_LIMIT_S:-570}
bench_until=${BENCH_UNTIL_S:-390}
models=${MODELS:-sine classify}
commit=$(measured_commit)
export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin" BUILD=$build PYTHON=$python COMMIT=$commit
for value in "$run_limit" "$bench_until"; do
  [[ $value =~ ^[1-9][0-9]*$ ]] || {
    echo "check-predictions: TIME_LIMIT_S and BENCH_UNTIL_S take whole seconds, got '$value'" >&2
    exit 2
  }
done
rm -rf "$work"
mkdir -p "$work/bench" "$out"

stage_names=()
stage_results=()
# stage NAME SECONDS: runs the function NAME under a time limit cut to what is left of the run's
# limit (less 10 s for the summary; killed 10 s after the TERM if still there) and records how it
# ended. The function is given that limit less 5 s, for the script it runs to keep within. A limit
# under 10 s skips the stage.
stage() {
  local name=$1 limit=$2 start=$SECONDS rc
  local left=$((run_limit - 10 - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  stage_names+=("$name")
  if [ "$limit" -lt 10 ]; then
    stage_results+=("SKIPPED (time limit reached)")
    return
  fi
  echo "== $name (limit $limit s)"
  timeout -k 10 "$limit" bash -c '"$@"' stage "$name" $((limit - 5))
  rc=$?
  local result=pass
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && result="TIMEOUT after $limit s"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && result="FAIL (exit $rc)"
  stage_results+=("$result, $((SECONDS - start)) s")
  echo "-- $name: $result"
  tar -czf "$out/predictions.tgz" -C "$work" .
}

# The stages, each given its time limit in seconds; each writes its output to its own files in
# $work.
build_sass() {
  ONLY=sass TIME_LIMIT_S=$1 OUT=$work bash scripts/gpu-check.sh >"$work/check.txt" 2>&1
}
tests() {
  "$build/minamp_tests" --gtest_filter='Gpu*:-GpuExamples.*:GpuBatchNorm.Large*' \
    >"$work/tests.txt" 2>&1
}
bench() {
  MODELS=$models TIME_LIMIT_S=$1 OUT=$work/bench bash bench/run-gpu.sh >/dev/null 2>&1
}
profile() {
  PROFILES="sine-step gemm-loop" TIME_LIMIT_S=$1 OUT=$work bash bench/profile-gpu.sh \
    >"$work/profile.txt" 2>&1
}
depth() {
  "$build/bench_gemm" --shapes depth --precisions f16 --no-versions --sweep \
    --json "$work/depth.json" >"$work/depth.txt" 2>&1 &&
    "$python" bench/report.py --platform gpu --gemm "$work/depth.json" --commit "$commit" \
      --out "$work/depth-report.json" --markdown "$work/depth-report.md" >>"$work/depth.txt" 2>&1
}
persistent() {
  MINAMP_GEMM_PERSISTENT=1 "$build/bench_train" --device cuda --models sine --precisions amp \
    --size 512 --warmup 12 --steps 200 --profile 5 --json "$work/persistent.json" \
    >"$work/persistent.txt" 2>&1
}
export build work python commit models
export -f build_sass tests bench profile depth persistent

echo "minamp: checking the open predictions on $(gpu_device), commit $commit, within $run_limit s"
stage build_sass 330
stage tests 60
stage bench $((bench_until - SECONDS))
stage profile 90
stage depth 50
stage persistent 30
# The tables the predictions are read from, then the stages.
shopt -s nullglob
for table in "$work"/bench/*.md "$work"/ncu-*.md "$work"/depth-report.md; do
  [ -f "$table" ] || continue
  echo
  echo "== ${table#"$work"/}"
  cat "$table"
done
echo
echo "== summary (every file in $out/predictions.tgz)"
failed=0
for i in "${!stage_names[@]}"; do
  printf '  %-12s %s\n' "${stage_names[$i]}" "${stage_results[$i]}"
  [[ ${stage_results[$i]} == pass* ]] || failed=1
done
exit "$failed"
