#!/usr/bin/env bash
# The GPU benchmark, run from the repository root on a machine with an NVIDIA GPU (no network
# needed) and deps/ beside it (scripts/gather-deps.sh): uses the configured build in $BUILD (default
# build-gpu, as scripts/gpu-check.sh leaves it) or configures one from deps/ for sm_90, builds
# bench_gemm, bench_train and the sine and mlp examples, launches the GEMM kernels once (rebuilt
# without compressing the machine code if the driver refuses it: first_launch in
# scripts/gpu-build.sh), then runs, in the order the targets need them, bench_gemm (WMMA / fp32
# GEMMs vs cuBLAS), bench_train --device cuda (mlp, sine 512x512, classify; FP32, AMP and AMP-bf16)
# each model followed by bench/pytorch/train.py --device cuda with $PYTHON, sine again from five
# more seeds, and last the examples' own comparison tables (sine --compare-dtypes at 512x512: FP32,
# AMP-f16 and AMP-bf16; mlp --compare; images and metrics under the parts folder). The log is
# written to ${OUT:-/tmp} as it comes, and the parts folder (${TMPDIR:-/tmp}/<name>-parts: the
# per-tool JSON and the examples' outputs) is packed into $OUT/<name>-parts.tgz after every stage,
# so that $OUT holds at most four files whatever happens (the log, the parts .tgz, and the report's
# .json and .md when there is one), in one folder. The report (whatever results there are, the
# missing ones listed) goes to bench/results/gpu-<device>-<date>-<commit>.{json,md}, with the log
# beside it, and is copied to $OUT. A run with no results at all writes nothing to bench/results. A
# target that does not build leaves the others to run. MODELS (default: mlp sine classify resnet50
# resnet50-frozen) names the models whose bench_train and PyTorch stages run; the report lists the
# others as missing. Every stage has a time limit, cut to what is left of the whole run's limit,
# $TIME_LIMIT_S seconds (default 540), so a result comes back even when one hangs (later stages are
# then skipped); expect 3-5 minutes on an H100, and up to 2 more for the seeds. COMMIT names the
# measured commit where the tree has no .git (an exported tree): its sha, with -dirty if it had
# uncommitted changes (git diff --quiet HEAD || echo -dirty, in the repository it came from). PYTHON
# (default python3) runs bench/pytorch/train.py and bench/report.py; CUDA_HOME (default
# /usr/local/cuda) has its bin/ appended to PATH; RESULTS (default bench/results) is where the
# report goes (tests/bench/test_run_gpu.py runs the whole script on stand-in tools).
#
#   COMMIT=<sha> bash bench/run-gpu.sh      (no arguments)
set -uo pipefail
# -h/--help prints the comment above; the script takes no arguments.
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/../scripts/args.sh"
# shellcheck source=scripts/run-names.sh
source "$(dirname "$0")/../scripts/run-names.sh"
# shellcheck source=scripts/gpu-build.sh
source "$(dirname "$0")/../scripts/gpu-build.sh" # configure_gpu_build, first_launch, ...
no_arguments run-gpu "$@"
cd "$(dirname "$0")/.." || exit 1

build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
out=${OUT:-/tmp}
results=${RESULTS:-bench/results}
gtest_prefix=/tmp/prefix
export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
device=$(gpu_device)
commit=$(measured_commit)
name="gpu-${device:-unknown}-$(date -u +%Y%m%d-%H%M)-$commit"
log=$results/$name.log
work=${TMPDIR:-/tmp}/$name-parts
run_limit=${TIME_LIMIT_S:-540}
all_models="mlp sine classify resnet50 resnet50-frozen"
models=${MODELS:-$all_models}
check_names run-gpu MODELS "$all_models" "$models"
mkdir -p "$results" "$work" "$out"

# Per model: the bench_train / train.py step options. sine trains 512 steps in all, as the ROCm
# blog; mlp 500, the seed config's 10 epochs of 50 batches.
declare -A steps=(
  [sine]="--size 512 --warmup 12 --steps 500 --infer-steps 50"
  [mlp]="--warmup 50 --steps 450 --infer-steps 100"
  [classify]="--warmup 20 --steps 200 --infer-steps 50"
  [resnet50]="--warmup 5 --steps 30 --infer-steps 10"
  [resnet50-frozen]="--warmup 5 --steps 30 --infer-steps 10"
)
# minamp only: after its timed steps, a few more with the op profiler on (CUDA events around each
# op), so the log shows where a step's GPU time goes; the same training replayed from a CUDA
# graph of one step (mode train-graph), which removes the launch overhead; and the same training
# with the batch-norm fusions off (mode train-unfused, profiled too), so each run measures what
# the fusions save or cost.
minamp_extra="--profile 5 --cuda-graph --unfused"
# PyTorch only: the other training configurations a PyTorch user would pick (NCHW, fused
# optimizers, both, torch.compile), so that each target compares with the fastest of them; mlp
# has no convs (NCHW is its only layout) and no compile (its step is launch-bound); ResNet-50 is
# compared with channels_last and fused Adam (the others would not fit the default 540 s).
declare -A pytorch_extra=([mlp]="--configs fused" [sine]="--configs nchw,fused,nchw-fused,compile"
  [classify]="--configs nchw,fused,nchw-fused,compile" [resnet50]="--configs fused"
  [resnet50-frozen]="--configs fused")
# torch.compile's first step compiles: the conv nets' PyTorch stages need longer.
declare -A pytorch_limit=([mlp]=90 [sine]=200 [classify]=200 [resnet50]=120 [resnet50-frozen]=90)

# shellcheck disable=SC2317 # configure and build_benches run through `stage` (bash -c)
configure() {
  [ -f "$build/build.ninja" ] && return 0
  echo "== configuring $build from deps/"
  build_googletest >/dev/null && configure_gpu_build >/dev/null
}

# The binaries are removed first (relinking is quick), so that each one there afterwards was built
# from this tree, and ninja keeps going (-k 0) past a target that does not compile.
# shellcheck disable=SC2317
build_benches() {
  configure || return 1
  rm -f "$build/bench_train" "$build/bench_gemm" "$build/sine" "$build/mlp"
  cmake --build "$build" --target bench_train bench_gemm sine mlp -j16 -- -k 0
}
export build gtest_prefix
export -f build_googletest configure_gpu_build first_launch configure build_benches

# stage NAME SECONDS COMMAND...: runs COMMAND under a time limit (cut to what is left of the
# run's time limit, less 20 s for the report; killed 10 s after the TERM if it is still there) and says how
# it ended.
stage() {
  local label=$1 limit=$2 start=$SECONDS rc
  shift 2
  local left=$((run_limit - 20 - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    echo "== $label: skipped, the run's time limit is spent"
    return 124
  fi
  echo "== $label (limit $limit s)"
  timeout -k 10 "$limit" bash -c '"$@"' stage "$@"
  rc=$?
  echo "-- $label: exit $rc, $((SECONDS - start)) s"
  tar -czf "$out/$name-parts.tgz" -C "$(dirname "$work")" "$(basename "$work")"
  return "$rc"
}

# bench_gemm PART (square-f16, model-f16, resnet50-f16, depth-f16 or all-f32): one process per
# part, so that a failure in one keeps the others (bench_gemm rewrites its JSON after every row, so
# a fault or a time limit keeps the rows before it; each shape's library row comes before its
# hooks' and versions' rows, and every shape's before the sweep's). The f16 parts time each
# version of the tensor-core GEMM too, and the sweep's tile configurations (square 4096, sine fwd
# and dgrad, two of ResNet-50's): tuning data; depth-f16, sine's forward GEMM at K = 64 to 1024
# with and without the batch norm hooks, splits its time into a tile's fixed cost and its main
# loop's.
gemm_parts=(square-f16 model-f16 resnet50-f16 depth-f16 all-f32)
run_gemm() {
  local sweep=()
  [ "${1#*-}" = f16 ] && sweep=(--sweep)
  stage "bench_gemm $1" 90 "$build/bench_gemm" --shapes "${1%-*}" --precisions "${1#*-}" \
    "${sweep[@]}" --json "$work/gemm-$1.json"
}

# run_model MODEL: minamp in FP32, then AMP, then AMP-bf16 (one process each, so that a slow or
# failing AMP run keeps the FP32 result), then PyTorch (which rewrites its JSON after every run,
# the other configurations last), so that each pair is measured close in time.
run_model() {
  local m=$1 p
  [[ " $models " == *" $m "* ]] || return 0
  for p in fp32 amp amp-bf16; do
    # shellcheck disable=SC2086
    stage "bench_train $m $p" 60 "$build/bench_train" --device cuda --models "$m" \
      --precisions "$p" ${steps[$m]} $minamp_extra --json "$work/minamp-$m-$p.json"
  done
  # shellcheck disable=SC2086
  stage "pytorch $m" "${pytorch_limit[$m]}" "$python" bench/pytorch/train.py --device cuda \
    --models "$m" \
    ${steps[$m]} ${pytorch_extra[$m]:-} --json "$work/pytorch-$m.json"
}

# The examples' own comparison tables on the GPU (sine at the blog's 512x512, hidden 256, 512
# steps, in FP32, AMP-f16 and AMP-bf16; mlp's seed config), with their images and metrics under
# $work.
run_examples() {
  stage "sine --compare-dtypes" 150 "$build/sine" --compare-dtypes --device cuda \
    --out "$work/sine"
  stage "mlp --compare" 60 "$build/mlp" --compare --device cuda --out "$work/mlp"
}

# The sine loss target compares AMP with FP32 from one init (seed 0); the same training from five
# more seeds gives the report's rows over seeds (informational for AMP, the target for AMP-bf16;
# one init's last-10 mean moves by 20% or more with the seed, bench/NOTES.md). Where MODELS has
# sine, they come after the models and before what is only informational.
run_seeds() {
  local seed
  [[ " $models " == *" sine "* ]] || return 0
  mkdir -p "$work/seeds"
  for seed in 1 2 3 4 5; do
    stage "bench_train sine seed $seed" 60 "$build/bench_train" --device cuda --models sine \
      --size 512 --warmup 12 --steps 500 --infer-steps 1 --seed "$seed" \
      --json "$work/seeds/minamp-sine-seed$seed.json"
  done
}

# The stages in the order the targets need them (a spent time limit skips the last ones): the
# 4096^3 GEMM, mlp, sine, the model GEMMs, classify, ResNet-50 and sine's other seeds, then what
# is only informational (ResNet-50's GEMMs, the depth rows, the f32 GEMMs, the examples).
main() {
  echo "minamp GPU benchmark $name"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  stage "build" 300 build_benches ||
    echo "bench: the build failed or ran out of time; running what was built"
  if [ ! -x "$build/bench_train" ] && [ ! -x "$build/bench_gemm" ]; then
    echo "bench: neither bench_train nor bench_gemm was built; nothing to run"
    return 1
  fi
  stage "first launch" 300 first_launch build_benches
  run_gemm square-f16
  run_model mlp
  run_model sine
  run_gemm model-f16
  run_model classify
  run_model resnet50
  run_model resnet50-frozen
  run_seeds
  run_gemm resnet50-f16
  run_gemm depth-f16
  run_gemm all-f32
  run_examples
  echo "== report"
  local gemm_json=() part
  for part in "${gemm_parts[@]}"; do gemm_json+=("$work/gemm-$part.json"); done
  "$python" bench/report.py --platform gpu --minamp "$work"/minamp-*.json \
    --minamp-seeds "$work"/seeds/*.json --pytorch "$work"/pytorch-*.json \
    --gemm "${gemm_json[@]}" --commit "$commit" --log "$log" \
    --out "$results/$name.json" --markdown "$results/$name.md"
}

main 2>&1 | tee "$out/$name.log"
rc=${PIPESTATUS[0]}
if [ -f "$results/$name.json" ]; then
  cp "$out/$name.log" "$log"
  cp "$results/$name.json" "$results/$name.md" "$out"/
  echo "results in $results/$name.{json,log,md} and $out"
else
  echo "no report; the log is $out/$name.log"
fi
exit "$rc"
