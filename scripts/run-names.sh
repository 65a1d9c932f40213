# What the GPU scripts (bench/run-gpu.sh, bench/profile-gpu.sh) name their results by, sourced:
# gpu_device prints the first GPU as nvidia-smi names it, in lower case with dashes and without
# "NVIDIA " (h200, h100-80gb-hbm3), or nothing without one; measured_commit prints $COMMIT, or
# else git's short HEAD, or "unknown".
# shellcheck shell=bash
gpu_device() {
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 |
    tr '[:upper:]' '[:lower:]' | sed -e 's/^nvidia //' -e 's/[^a-z0-9]\+/-/g' -e 's/-$//'
}
measured_commit() { echo "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"; }
