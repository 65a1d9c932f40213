#!/usr/bin/env bash
# The GPU benchmark, run ON the GPU machine (no network) from the repository root with deps/
# carried (scripts/gather-deps.sh): uses the configured build in $BUILD (default build-gpu, as
# scripts/gpu-check.sh leaves it) or configures one from deps/ for sm_90, builds bench_gemm and
# bench_train, then runs bench_gemm (WMMA / fp32 GEMMs vs cuBLAS), bench_train --device cuda
# (mlp, sine 512x512, classify; FP32 and AMP), bench/pytorch/train.py --device cuda with the
# GPU machine's python3, and the examples' own FP32-vs-AMP tables (sine --compare at 512x512, mlp
# --compare; images and metrics under the parts folder). Writes bench/results/gpu-<device>-<date>-<commit>.{json,log,md} and
# copies them to ${OUT:-/tmp} (the log and the per-tool JSON parts are written there as they
# come). Every stage has a time limit, and all of them together stay within $BUDGET_S seconds
# (default 540), so a result comes back even when one hangs; expect 3-5 minutes on an H100.
# COMMIT names the measured commit where the copied tree has no .git.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
out=${OUT:-/tmp}
results=bench/results
gtest_prefix=/tmp/prefix
export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 |
  tr '[:upper:]' '[:lower:]' | sed -e 's/^nvidia //' -e 's/[^a-z0-9]\+/-/g' -e 's/-$//')
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
name="gpu-${device:-unknown}-$(date -u +%Y%m%d-%H%M)-$commit"
log=$results/$name.log
work=$out/$name-parts
budget=${BUDGET_S:-540}
mkdir -p "$results" "$work"

# Per model: the bench_train / train.py step options. sine trains 512 steps in all, as the ROCm
# blog; mlp 500, the seed config's 10 epochs of 50 batches.
declare -A steps=(
  [sine]="--size 512 --warmup 12 --steps 500 --infer-steps 50"
  [mlp]="--warmup 50 --steps 450 --infer-steps 100"
  [classify]="--warmup 20 --steps 200 --infer-steps 50"
)
models=(mlp sine classify)

# GoogleTest is only needed because CMakeLists.txt requires it at configure time.
# shellcheck disable=SC2317 # configure and build_benches run through `stage` (bash -c)
configure() {
  [ -f "$build/build.ninja" ] && return 0
  echo "== configuring $build from deps/"
  if [ ! -d "$gtest_prefix/lib/cmake/GTest" ] && [ ! -d "$gtest_prefix/lib64/cmake/GTest" ]; then
    cmake -S deps/googletest -B /tmp/googletest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$gtest_prefix" >/dev/null &&
      cmake --build /tmp/googletest-build -j16 >/dev/null &&
      cmake --install /tmp/googletest-build >/dev/null || return 1
  fi
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMINAMP_CUDA_ARCHS=90 \
    -DCMAKE_PREFIX_PATH="$PWD/deps/prefix;$gtest_prefix" >/dev/null
}

# shellcheck disable=SC2317
build_benches() {
  configure && cmake --build "$build" --target bench_train bench_gemm sine mlp -j16
}
export build gtest_prefix
export -f configure build_benches

# stage NAME SECONDS COMMAND...: runs COMMAND under a time limit (cut to what is left of the
# budget, less 20 s for the report) and says how it ended.
stage() {
  local label=$1 limit=$2 start=$SECONDS rc
  shift 2
  local left=$((budget - 20 - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    echo "== $label: skipped, the time budget is spent"
    return 124
  fi
  echo "== $label (limit $limit s)"
  timeout "$limit" bash -c '"$@"' stage "$@"
  rc=$?
  echo "-- $label: exit $rc, $((SECONDS - start)) s"
  return "$rc"
}

run_minamp() {
  for m in "${models[@]}"; do
    # shellcheck disable=SC2086
    stage "bench_train $m" 75 "$build/bench_train" --device cuda --models "$m" ${steps[$m]} \
      --json "$work/minamp-$m.json"
  done
}

# The examples' own FP32-vs-AMP tables on the GPU (sine at the blog's 512x512, hidden 256, 512
# steps; mlp's seed config), with their images and metrics under $work.
run_examples() {
  stage "sine --compare" 120 "$build/sine" --compare --device cuda --out "$work/sine"
  stage "mlp --compare" 60 "$build/mlp" --compare --device cuda --out "$work/mlp"
}

run_pytorch() {
  for m in "${models[@]}"; do
    # shellcheck disable=SC2086
    stage "pytorch $m" 75 "$python" bench/pytorch/train.py --device cuda --models "$m" \
      ${steps[$m]} --json "$work/pytorch-$m.json"
  done
}

main() {
  echo "minamp GPU benchmark $name"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  stage "build" 240 build_benches || {
    echo "bench: build failed; nothing to run"
    return 1
  }
  stage "bench_gemm" 120 "$build/bench_gemm" --json "$work/gemm.json"
  run_minamp
  run_pytorch
  run_examples
  echo "== report"
  "$python" bench/report.py --platform gpu --minamp "$work"/minamp-*.json \
    --pytorch "$work"/pytorch-*.json --gemm "$work/gemm.json" --commit "$commit" --log "$log" \
    --out "$results/$name.json" --markdown "$results/$name.md"
}

main 2>&1 | tee "$log" "$out/$name.log"
rc=${PIPESTATUS[0]}
cp "$results/$name.json" "$results/$name.md" "$out"/ 2>/dev/null
echo "results in $results/$name.* and $out"
exit "$rc"
