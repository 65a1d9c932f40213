#!/usr/bin/env bash
# Gathers minamp's header-only and source dependencies from this machine's Debian packages into
# deps/ (git-ignored), for a machine that has compilers but no package registry (the GPU machine):
#
#   deps/prefix/include   Eigen3, nlohmann-json, CLI11, stb (include/stb), zlib headers
#   deps/prefix/share     the CMake package configs of Eigen3, nlohmann-json and CLI11
#   deps/prefix/lib       zlib's static library
#   deps/googletest       GoogleTest sources (scripts/gpu-check.sh builds them there)
#
# CMakeLists.txt puts deps/prefix first on CMAKE_PREFIX_PATH. The files to copy come from
# `dpkg -L`, so they are exactly what the packages install; copied CMake configs that name an
# absolute /usr path are rewritten relative to their own location. Rebuilds deps/ from scratch,
# after installing those packages that are missing (apt-get, through sudo when not root).
#
#   bash scripts/gather-deps.sh       (no arguments)
set -euo pipefail
# -h/--help prints the comment above; the script takes no arguments.
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/args.sh"
no_arguments gather-deps "$@"
cd "$(dirname "$0")/.."

packages=(libeigen3-dev nlohmann-json3-dev libcli11-dev libstb-dev zlib1g-dev libgtest-dev)
prefix=deps/prefix

install_missing_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "gather-deps: installing ${missing[*]}"
  local sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Where a file a package installed goes in the prefix (empty: not needed). Headers keep their
# path under include/, CMake configs under share/, and only zlib's static library is kept from
# lib/ (stb is used header-only; its libstb.a is not needed).
destination_of() {
  case "$1" in
  /usr/include/*) echo "$prefix/include/${1#/usr/include/}" ;;
  /usr/share/eigen3/cmake/* | /usr/share/cmake/*) echo "$prefix/share/${1#/usr/share/}" ;;
  /usr/lib/*/libz.a) echo "$prefix/lib/libz.a" ;;
  *) ;;
  esac
}

copy_package_files() {
  local package=$1 file dest
  while read -r file; do
    [ -f "$file" ] || continue
    dest=$(destination_of "$file")
    [ -n "$dest" ] || continue
    mkdir -p "$(dirname "$dest")"
    cp "$file" "$dest"
  done < <(dpkg -L "$package")
}

# Rewrites absolute /usr/ paths in copied CMake files to paths relative to the file itself.
relocate_cmake_configs() {
  local file dir up
  while read -r file; do
    dir=$(dirname "${file#"$prefix"/}")
    up=$(echo "$dir" | sed -E 's#[^/]+#..#g')
    echo "gather-deps: relocating absolute paths in $file"
    sed -i -E "s#([\"; ])/usr/#\1\${CMAKE_CURRENT_LIST_DIR}/$up/#g" "$file"
  done < <(grep -rlE '["; ]/usr/(include|lib|share)' "$prefix/share" --include='*.cmake' || true)
}

install_missing_packages
rm -rf deps/prefix deps/googletest
mkdir -p "$prefix"/{include,share,lib}
for p in libeigen3-dev nlohmann-json3-dev libcli11-dev libstb-dev zlib1g-dev; do
  copy_package_files "$p"
done
relocate_cmake_configs
cp -r /usr/src/googletest deps/googletest

for required in "$prefix/share/eigen3/cmake/Eigen3Config.cmake" \
  "$prefix/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" \
  "$prefix/share/cmake/CLI11/CLI11Config.cmake" "$prefix/include/stb/stb_image.h" \
  "$prefix/include/zlib.h" "$prefix/lib/libz.a" deps/googletest/CMakeLists.txt; do
  [ -f "$required" ] || {
    echo "gather-deps: missing $required after copying" >&2
    exit 1
  }
done
echo "gather-deps: deps/ holds $(du -sh deps | cut -f1) ($(find deps -type f | wc -l) files)"
