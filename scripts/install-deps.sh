#!/usr/bin/env bash
# Installs the Debian packages minamp builds and runs with, only those that are missing.
# Idempotent; needs root (or sudo) only when something is missing. With `fuzz`, also clang and its
# libFuzzer, for `make fuzz`.
#
#   bash scripts/install-deps.sh          (run by `make deps` and every build target)
#   bash scripts/install-deps.sh fuzz     (run by `make fuzz`)
set -euo pipefail
# -h/--help prints the comment above; the only argument is `fuzz`.
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/args.sh"
fuzz=
if [ "${1-}" = fuzz ]; then
  fuzz=1
  shift
fi
no_arguments install-deps "$@"

packages=(
  cmake ninja-build g++ make pkg-config
  libeigen3-dev     # CPU reference backend
  libstb-dev        # PNG/JPEG reading and writing
  libgtest-dev      # tests
  libcli11-dev      # command-line parsing in the examples
  nlohmann-json3-dev # summary.json, safetensors headers
  zlib1g-dev        # gzipped IDX files
  dataset-fashion-mnist # the classifier's data set
  python3           # tests of bench/report.py (json, unittest)
)
[ -z "$fuzz" ] || packages+=(clang libclang-rt-dev) # libFuzzer and the sanitizers' runtimes

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
