#!/usr/bin/env bash
# The CPU benchmark (`make bench`): builds bench_train in BUILD_DIR, runs minamp's mlp, sine
# (64x64) and classify in FP32 and AMP, each followed by the same model in PyTorch CPU eager from
# a virtual environment in bench/.venv (created here, torch from PyPI; if that fails the minamp
# half is still written), with the same thread count. Writes
# bench/results/cpu-<date>-<commit>.{json,log,md} and prints the table with targets and ratios.
#
#   bash bench/run-cpu.sh [BUILD_DIR]      (default: build, configured by `make build`)
#
# BENCH_THREADS sets the threads of both frameworks (default: nproc); COMMIT names the measured
# commit (default: git's HEAD); VENV (default bench/.venv) is PyTorch's virtual environment and
# RESULTS (default bench/results) where the report goes (tests/bench/test_run_cpu.py runs the
# whole script on stand-in tools). The figures are only as clean as the machine is idle: the
# report records the load average.
set -uo pipefail
# -h/--help prints the comment above; one BUILD_DIR at most, not starting with '-'.
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/../scripts/args.sh" # usage
for arg in "$@"; do
  case $arg in
  -h | --help) usage; exit 0 ;;
  -*) echo "run-cpu: unknown option '$arg' (see: bash $0 --help)" >&2; exit 2 ;;
  esac
done
if [ $# -gt 1 ]; then
  echo "run-cpu: unexpected argument '$2': takes one BUILD_DIR at most (see: bash $0 --help)" >&2
  exit 2
fi
cd "$(dirname "$0")/.." || exit 1

build=${1:-build}
venv=${VENV:-bench/.venv}
results=${RESULTS:-bench/results}
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) # (nproc obeys both)
threads=${BENCH_THREADS:-$cores}
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
name="cpu-$(date -u +%Y%m%d-%H%M)-$commit"
log=$results/$name.log
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$results"
export OMP_NUM_THREADS=$threads

# Per model: the bench_train / train.py step options. sine runs 512 steps in all, as the ROCm
# blog trains it; mlp 500, the seed config's 10 epochs of 50 batches.
declare -A steps=(
  [sine]="--size 64 --warmup 12 --steps 500 --infer-steps 20"
  [mlp]="--warmup 50 --steps 450 --infer-steps 50"
  [classify]="--warmup 3 --steps 20 --infer-steps 10"
  [resnet18]="--resnet-size 224 --resnet-batch 1 --warmup 1 --steps 4 --infer-steps 20"
)
# PyTorch's CPU fp16 autocast is far slower than its FP32 (about 0.55 s a sine step on 2 cores,
# 16× its FP32), so its sine, classify and resnet18 AMP runs (f16 and bf16) take fewer steps to
# keep the bench near 5 minutes: their times are informational (the CPU targets compare FP32) and
# their final losses are not comparable with minamp's.
declare -A pytorch_amp_steps=(
  [sine]="--size 64 --warmup 2 --steps 20 --infer-steps 5"
  [mlp]="${steps[mlp]}"
  [classify]="--warmup 2 --steps 10 --infer-steps 5"
  [resnet18]="--resnet-size 224 --resnet-batch 1 --warmup 1 --steps 1 --infer-steps 2"
)
models=(mlp sine classify resnet18)
# The sine loss target compares AMP with FP32 from one init (seed 0); the same training from these
# seeds gives the report's rows over seeds (informational for AMP, the target for AMP-bf16) (one init's last-10 mean moves by 20% or
# more with the seed, bench/NOTES.md).
seeds=(1 2 3 4 5)

build_minamp() {
  cmake --build "$build" --target bench_train -j "$threads"
}

run_minamp() {
  echo "== minamp $1 (bench_train, $threads threads)"
  # shellcheck disable=SC2086
  "$build/bench_train" --device cpu --models "$1" ${steps[$1]} --json "$work/minamp-$1.json"
}

run_seeds() {
  echo "== minamp sine from seeds ${seeds[*]} (bench_train, $threads threads)"
  mkdir -p "$work/seeds"
  local seed
  for seed in "${seeds[@]}"; do
    "$build/bench_train" --device cpu --models sine --size 64 --warmup 12 --steps 500 \
      --infer-steps 1 --seed "$seed" --json "$work/seeds/minamp-sine-seed$seed.json" || return 1
  done
}

# Creates the venv and installs torch and torchvision (resnet18's model; CPU use, PyPI's wheels)
# unless they are there already.
ensure_torch() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import torch, torchvision' 2>/dev/null &&
    return 0
  echo "== installing PyTorch into $venv (PyPI; a large download, once)"
  python3 -m venv "$venv" &&
    "$venv/bin/pip" install --disable-pip-version-check -q torch torchvision numpy
}

run_pytorch() {
  echo "== PyTorch CPU eager $1 ($threads threads)"
  # shellcheck disable=SC2086
  "$venv/bin/python" bench/pytorch/train.py --device cpu --threads "$threads" --models "$1" \
    --precisions fp32 ${steps[$1]} --json "$work/pytorch-$1-fp32.json" &&
    "$venv/bin/python" bench/pytorch/train.py --device cpu --threads "$threads" --models "$1" \
      --precisions amp ${pytorch_amp_steps[$1]} --json "$work/pytorch-$1-amp.json" &&
    "$venv/bin/python" bench/pytorch/train.py --device cpu --threads "$threads" --models "$1" \
      --precisions amp-bf16 ${pytorch_amp_steps[$1]} --json "$work/pytorch-$1-amp-bf16.json"
}

# Model by model, minamp then PyTorch, so that each pair is measured minutes apart at most: the
# 2-core host's speed drifts between modes (bench/NOTES.md).
main() {
  echo "minamp CPU benchmark $name: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)," \
    "$cores cores, $threads threads, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  build_minamp || {
    echo "bench: bench_train did not build; nothing to report"
    return 1
  }
  local status=ran
  if ! ensure_torch; then
    status="torch could not be installed from PyPI (see the log)"
    echo "bench: $status; writing the minamp half only"
  fi
  for m in "${models[@]}"; do
    run_minamp "$m" || {
      echo "bench: bench_train failed on $m; nothing to report"
      return 1
    }
    if [ "$status" = ran ] && ! run_pytorch "$m"; then
      status="the PyTorch benchmark failed on $m (see the log)"
    fi
  done
  run_seeds || echo "bench: bench_train failed on a sine seed; the row over seeds has the others"
  echo "== report"
  python3 bench/report.py --platform cpu --minamp "$work"/minamp-*.json \
    --minamp-seeds "$work"/seeds/*.json --pytorch "$work"/pytorch-*.json \
    --pytorch-status "$status" --commit "$commit" --log "$log" \
    --out "$results/$name.json" --markdown "$results/$name.md"
}

main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
