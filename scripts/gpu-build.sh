# The GPU machine's build, shared by scripts/gpu-check.sh and bench/run-gpu.sh, which source this
# file after setting $build (the build folder) and $gtest_prefix (where GoogleTest is installed):
# GoogleTest from deps/, minamp configured from deps/ for sm_90, and the first launch, which
# checks that this machine's driver loads the machine code that was built.
# shellcheck shell=bash
# shellcheck disable=SC2154 # $build and $gtest_prefix come from the sourcing script

# Builds and installs deps/googletest into $gtest_prefix (CMakeLists.txt needs it at configure
# time); skipped when an earlier run on this machine installed it. A stale build folder (from
# another checkout) is removed first.
build_googletest() {
  [ -d "$gtest_prefix/lib/cmake/GTest" ] || [ -d "$gtest_prefix/lib64/cmake/GTest" ] && return 0
  rm -rf /tmp/googletest-build
  cmake -S deps/googletest -B /tmp/googletest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$gtest_prefix" &&
    cmake --build /tmp/googletest-build -j16 &&
    cmake --install /tmp/googletest-build
}

# configure_gpu_build [CMAKE_OPTION...]: configures $build, a release build for sm_90 with the
# GPU tests on the device (no emulator), with the options given added.
configure_gpu_build() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMINAMP_CUDA_ARCHS=90 \
    -DMINAMP_CUDA_EMULATOR=OFF -DCMAKE_PREFIX_PATH="$PWD/deps/prefix;$gtest_prefix" "$@"
}

# first_launch BUILD_COMMAND...: runs the tensor-core GEMMs once, every version and epilogue
# (`bench_gemm --shapes tiny`, a few seconds). The machine code is compressed for size by default
# (MINAMP_CUDA_COMPRESS_FOR_SIZE); a driver that cannot inflate it refuses the first launch with
# an error that names the kernel image. Then the build is configured with
# -DMINAMP_CUDA_COMPRESS_FOR_SIZE=OFF, BUILD_COMMAND rebuilds it, and the launch is tried again,
# so that a refusal costs one rebuild rather than every stage after it. Any other failure is
# returned as it is.
first_launch() {
  local log=${TMPDIR:-/tmp}/minamp-first-launch.log
  [ -x "$build/bench_gemm" ] || { echo "first launch: no $build/bench_gemm was built"; return 1; }
  if "$build/bench_gemm" --shapes tiny --precisions f16 >"$log" 2>&1; then
    echo "first launch: the GEMM kernels ran; this driver loads the machine code"
    return 0
  fi
  cat "$log"
  grep -q "kernel image" "$log" || return 1
  echo "first launch: the driver refused the kernel image; rebuilding" \
    "with -DMINAMP_CUDA_COMPRESS_FOR_SIZE=OFF"
  configure_gpu_build -DMINAMP_CUDA_COMPRESS_FOR_SIZE=OFF && "$@" || return 1
  "$build/bench_gemm" --shapes tiny --precisions f16 || return 1
  echo "first launch: the GEMM kernels ran, from machine code not compressed for size"
}
