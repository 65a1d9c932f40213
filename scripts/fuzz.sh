#!/usr/bin/env bash
# Coverage-guided fuzzing of minamp's file loaders (tests/fuzz/fuzz_targets.h), run by `make fuzz`
# after it has built $BUILD (default build-fuzz) with clang and -DMINAMP_FUZZ=ON. Each target runs
# minamp_fuzz (libFuzzer, AddressSanitizer, UndefinedBehaviorSanitizer) for FUZZ_SECONDS (default
# 60) from its corpus, $BUILD/corpus/<target>, which starts as the target's seeds and keeps what
# libFuzzer adds between runs. An input fails when it crashes, trips a sanitizer, or makes a
# loader allocate more than 1 GiB at once (none needs that: an image at the loaders' pixel limit,
# 2^25, takes 512 MiB; more means a size read from the file was trusted). A failing input is
# written to $BUILD/crashes/<target>-*, with its report in $BUILD/crashes/<target>.log; the run
# goes on to the next target and exits 1 at the end. To keep a failing input as a regression test
# once it is fixed, copy it to tests/fuzz/regressions/<target>/ (ctest fuzz.regressions.<target>
# replays it).
# FUZZ_TARGETS (default: every target) names the targets to run.
#
#   bash scripts/fuzz.sh      (no arguments)
set -uo pipefail
# -h/--help prints the comment above; the script takes no arguments.
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/args.sh"
no_arguments fuzz "$@"
cd "$(dirname "$0")/.." || exit 1

build=${BUILD:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
for tool in minamp_fuzz minamp_fuzz_replay; do
  [ -x "$build/$tool" ] ||
    { echo "fuzz: no $build/$tool (build it with \`make fuzz\`)" >&2; exit 1; }
done
all_targets=$("$build/minamp_fuzz_replay" --list | xargs) || exit 1
targets=${FUZZ_TARGETS:-$all_targets}
check_names fuzz FUZZ_TARGETS "$all_targets" "$targets"
[[ $seconds =~ ^[1-9][0-9]*$ ]] ||
  { echo "fuzz: FUZZ_SECONDS is '$seconds', not a whole number of seconds above 0" >&2; exit 2; }

"$build/minamp_fuzz_replay" --write-seeds "$build/corpus" >/dev/null || exit 1
mkdir -p "$build/crashes"
failed=()
for target in $targets; do
  echo "== $target: $seconds s from $(find "$build/corpus/$target" -type f | wc -l) inputs"
  log=$build/crashes/$target.log
  if "$build/minamp_fuzz" "--target=$target" -max_total_time="$seconds" -malloc_limit_mb=1024 \
    -print_final_stats=1 -artifact_prefix="$build/crashes/$target-" "$build/corpus/$target" \
    >"$log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^Done' "$log" | tail -n 1
    rm -f "$log"
  else
    tail -n 30 "$log"
    failed+=("$target")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failing inputs for ${failed[*]} in $build/crashes (reports: <target>.log)"
  exit 1
fi
echo "fuzz: no failures in ${targets// /, }"
