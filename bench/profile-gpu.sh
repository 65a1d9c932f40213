#!/usr/bin/env bash
# The GPU profile, run from the repository root on a machine with an NVIDIA GPU and Nsight
# Compute (ncu), after scripts/gpu-check.sh or bench/run-gpu.sh has configured the build in $BUILD
# (default build-gpu; bench_train and bench_gemm are built there if missing). Three profiles, each
# a Markdown table of bench/ncu_table.py:
#   - sine-step: every kernel of one sine AMP training step (512x512, hidden 256) with its time,
#     grid, block and registers, and the time per kernel function: the fused default;
#   - sine-step-unfused: the same step with MINAMP_FUSION=0;
#   - gemm-loop: the tensor-core GEMM's kernels over bench_gemm's square shapes (the library's,
#     one launch per configuration), with what says whether their main loop is held by the tensor
#     pipe or by stalls: the tensor pipe's busy share, instructions issued per cycle, cycles
#     between a warp's instructions and their split by stall reason.
# Nsight Compute runs with --clock-control none and --cache-control none (the GPU's own clocks,
# caches kept between kernels as in training). A metric this ncu does not know (named in one of its
# ==ERROR== lines) is dropped and the profile run again without it. The tables go to
# bench/results/ncu-<device>-<date>-<commit>.md and $OUT (default /tmp), ncu's CSV files (written to
# ${TMPDIR:-/tmp}/<name>-csv) packed into $OUT/<name>-csv.tgz; a run with no table writes nothing to
# bench/results. Every profile has a time limit, cut to what is left of the run's limit,
# $TIME_LIMIT_S seconds (default 300); expect ~2-3 minutes on an H200. PROFILES (default: sine-step
# sine-step-unfused gemm-loop) names the profiles to run; COMMIT, PYTHON, CUDA_HOME and RESULTS as
# in bench/run-gpu.sh.
#
#   COMMIT=<sha> bash bench/profile-gpu.sh      (no arguments)
set -uo pipefail
# -h/--help prints the comment above; the script takes no arguments.
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/../scripts/args.sh"
# shellcheck source=scripts/run-names.sh
source "$(dirname "$0")/../scripts/run-names.sh"
no_arguments profile-gpu "$@"
cd "$(dirname "$0")/.." || exit 1

build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
out=${OUT:-/tmp}
results=${RESULTS:-bench/results}
export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
device=$(gpu_device)
commit=$(measured_commit)
name="ncu-${device:-unknown}-$(date -u +%Y%m%d-%H%M)-$commit"
work=${TMPDIR:-/tmp}/$name-csv
run_limit=${TIME_LIMIT_S:-300}
all_profiles="sine-step sine-step-unfused gemm-loop"
profiles=${PROFILES:-$all_profiles}
check_names profile-gpu PROFILES "$all_profiles" "$profiles"
command -v ncu >/dev/null || { echo "profile-gpu: no ncu (Nsight Compute) on PATH" >&2; exit 1; }
mkdir -p "$results" "$work" "$out"

# One sine AMP step needs a step before it (the first allocates and plans) and one after (the
# table takes the kernels between two optimizer launches).
sine_step=(--device cuda --models sine --precisions amp --size 512 --warmup 1 --steps 1
  --infer-steps 1)
# join ITEM...: the items separated by commas, as ncu's --metrics takes them.
join() { local IFS=,; echo "$*"; }
launch=(gpu__time_duration.sum launch__grid_size launch__block_size launch__registers_per_thread)
step_metrics=$(join "${launch[@]}")
loop=(sm__warps_active.avg.per_cycle_active
  sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  smsp__issue_active.avg.per_cycle_active smsp__average_warps_active_per_issue_active.ratio)
for stall in wait short_scoreboard long_scoreboard barrier math_pipe_throttle mio_throttle \
  not_selected dispatch_stall; do
  loop+=("smsp__average_warps_issue_stalled_${stall}_per_issue_active.ratio")
done
loop_metrics=$(join "${launch[@]}" "${loop[@]}")

# profile NAME SECONDS METRICS [NCU_OPTION...] PROGRAM [ARG...]: ncu's CSV of PROGRAM's kernels in
# $work/NAME.csv (with ncu's own messages), PROGRAM's output in $work/NAME.log, under a time limit
# cut to what is left of the run's. A metric an ==ERROR== line names is dropped, and ncu run
# again (three times at most).
profile() {
  local label=$1 limit=$2 metrics=$3 start=$SECONDS rc tries metric bad
  shift 3
  local left=$((run_limit - 10 - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    echo "== $label: skipped, the run's time limit is spent"
    return 124
  fi
  echo "== $label (limit $limit s)"
  for tries in 1 2 3; do
    left=$((limit + start - SECONDS))
    [ "$left" -le 0 ] && rc=124 && break
    timeout -k 10 "$left" ncu --csv --log-file "$work/$label.csv" --metrics "$metrics" \
      --clock-control none --cache-control none "$@" >"$work/$label.log" 2>&1
    rc=$?
    bad=()
    for metric in ${metrics//,/ }; do
      cat "$work/$label.log" "$work/$label.csv" 2>/dev/null | grep '==ERROR==' |
        grep -qF "$metric" && bad+=("$metric")
    done
    [ "$rc" -eq 0 ] || [ "${#bad[@]}" -eq 0 ] || [ "$tries" -eq 3 ] && break
    echo "ncu does not know ${bad[*]}: profiling again without"
    for metric in "${bad[@]}"; do
      metrics=$(echo ",$metrics," | sed "s/,$metric,/,/; s/^,//; s/,$//")
    done
  done
  tail -n 5 "$work/$label.log"
  grep -h '==ERROR==' "$work/$label.csv" 2>/dev/null | head -n 5
  echo "-- $label: exit $rc, $((SECONDS - start)) s"
  return "$rc"
}

# table NAME TITLE [--step REGEX]: NAME's CSV as a Markdown table, appended to the report.
table() {
  local label=$1 title=$2
  shift 2
  "$python" bench/ncu_table.py --title "$title" "$@" "$work/$label.csv" >>"$work/$name.md"
  echo >>"$work/$name.md"
}

main() {
  echo "minamp GPU profile $name"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  local gpu ncu_version
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1)
  ncu_version=$(ncu --version | tail -n 1)
  echo "$ncu_version"
  if [ ! -x "$build/bench_train" ] || [ ! -x "$build/bench_gemm" ]; then
    [ -f "$build/build.ninja" ] || {
      echo "profile-gpu: no build in $build: run scripts/gpu-check.sh or bench/run-gpu.sh first"
      return 1
    }
    cmake --build "$build" --target bench_train bench_gemm -j16 || return 1
  fi
  {
    echo "# Nsight Compute profiles, $name"
    echo
    echo "Device: $gpu; $ncu_version; commit $commit; $(date -u +%Y-%m-%dT%H:%MZ)."
    echo "ncu --clock-control none --cache-control none; times in µs."
    echo
  } >"$work/$name.md"
  local failed=0
  if [[ " $profiles " == *" sine-step "* ]]; then
    profile sine-step 90 "$step_metrics" "$build/bench_train" "${sine_step[@]}" &&
      table sine-step "sine AMP step (512x512), fused (default)" --step adam_kernel || failed=1
  fi
  if [[ " $profiles " == *" sine-step-unfused "* ]]; then
    MINAMP_FUSION=0 profile sine-step-unfused 90 "$step_metrics" "$build/bench_train" \
      "${sine_step[@]}" &&
      table sine-step-unfused "sine AMP step (512x512), MINAMP_FUSION=0" --step adam_kernel ||
      failed=1
  fi
  if [[ " $profiles " == *" gemm-loop "* ]]; then
    profile gemm-loop 120 "$loop_metrics" -k regex:gemm_v5 --filter-mode per-launch-config \
      --launch-count 1 "$build/bench_gemm" --shapes square --precisions f16 --no-versions &&
      table gemm-loop "v5 GEMM over the square shapes, one launch per configuration" ||
      failed=1
  fi
  return "$failed"
}

main 2>&1 | tee "$out/$name.log"
rc=${PIPESTATUS[0]}
tar -czf "$out/$name-csv.tgz" -C "$(dirname "$work")" "$(basename "$work")"
if grep -q '^## ' "$work/$name.md" 2>/dev/null; then
  cp "$work/$name.md" "$results/$name.md"
  cp "$work/$name.md" "$out/"
  cat "$work/$name.md"
  echo "tables in $results/$name.md and $out"
fi
exit "$rc"
