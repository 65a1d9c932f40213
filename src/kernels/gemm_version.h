// Which version of the tensor-core GEMM the CUDA backend runs. The versions are a ladder a reader
// can follow (cuda/gemm_v1_naive.cu ... cuda/gemm_v5_multistage.cu, each saying what it changes and
// what that bought); `automatic` lets the planner (cuda/gemm_plan.h) pick the fastest one that can
// run the GEMM, which is what training uses. Forcing a version is for tests, benchmarks and
// study: the choice is process-wide, set by set_gemm_version or, once at start-up, by the
// environment variable MINAMP_GEMM_VERSION (auto, v1, v2, v3, v4 or v5).
#pragma once

#include <optional>
#include <string>

namespace minamp {

enum class GemmVersion {
  automatic,
  v1_naive,      // WMMA, one warp per 16x16 tile, fragments straight from global memory
  v2_wmma,       // WMMA, shared-memory tiles, cp.async pipeline, split K
  v3_interior,   // v2 + pointer-bump loads for interior tiles, 16-byte-pack epilogue
  v4_mma,        // ldmatrix + mma.sync (inline PTX), 64x64 warp tiles, fragments double-buffered
  v5_multistage, // v4 with one barrier per K tile, hidden behind MMAs (CUTLASS's multistage loop)
};

// "auto", "v1" ... "v5".
const char* gemm_version_name(GemmVersion version);
// The version a name gives, or nothing when it names none.
std::optional<GemmVersion> parse_gemm_version(const std::string& name);

// The version the CUDA backend runs now: the last set_gemm_version, else MINAMP_GEMM_VERSION
// (an unknown name there is an error naming the variable), else automatic.
GemmVersion gemm_version();
void set_gemm_version(GemmVersion version);

// Sets a version for the lifetime of the object, then puts the previous one back.
class ScopedGemmVersion {
public:
  explicit ScopedGemmVersion(GemmVersion version) : previous_(gemm_version()) {
    set_gemm_version(version);
  }
  ~ScopedGemmVersion() { set_gemm_version(previous_); }
  ScopedGemmVersion(const ScopedGemmVersion&) = delete;
  ScopedGemmVersion& operator=(const ScopedGemmVersion&) = delete;

private:
  GemmVersion previous_;
};

} // namespace minamp
