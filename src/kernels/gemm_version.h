// Which version of the tensor-core GEMM the CUDA backend runs. The versions are a ladder a reader
// can follow (cuda/gemm_v1_naive.cu ... cuda/gemm_v5_multistage.cu, each saying what it changes and
// what that bought); `automatic` lets the planner (cuda/gemm_plan.h) pick the fastest one that can
// run the GEMM, which is what training uses. Forcing a version is for tests, benchmarks and
// study: the choice is process-wide, set by set_gemm_version or, once at start-up, by the
// environment variable MINAMP_GEMM_VERSION (auto, v1, v2, v3, v4 or v5). How v5 walks its tiles is
// a second such choice (gemm_persistent_tiles).
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

// The SM count the GEMM planner (cuda/gemm_plan.h) plans for: 0, the default, plans for the GPU's
// own; a positive count plans as if the GPU had that many SMs, so that a small problem takes the
// plan a larger GPU gives a large one (tests, and reading plans on the emulator). Process-wide.
int gemm_planning_sms();
void set_gemm_planning_sms(int sms);

// Whether v5 runs its large tiles on a persistent grid where K is not split and the GPU has the
// shared memory (gemm_v5_persistent_kernel, cuda/gemm_v5.cuh: a block for each SM the planner
// plans for walks the tiles and puts each next tile's first K tile in flight during its epilogue).
// Off by default: the library takes it once a GPU measures it faster. Process-wide, set by
// set_gemm_persistent_tiles or, once at start-up, by the environment variable
// MINAMP_GEMM_PERSISTENT (0 or 1).
bool gemm_persistent_tiles();
void set_gemm_persistent_tiles(bool on);

// Sets a process-wide GEMM setting (get, set) for the lifetime of the object, then puts the
// previous value back.
template <class T, T (*get)(), void (*set)(T)> class ScopedGemmSetting {
public:
  explicit ScopedGemmSetting(T value) : previous_(get()) { set(value); }
  ~ScopedGemmSetting() { set(previous_); }
  ScopedGemmSetting(const ScopedGemmSetting&) = delete;
  ScopedGemmSetting& operator=(const ScopedGemmSetting&) = delete;

private:
  T previous_;
};
using ScopedGemmVersion = ScopedGemmSetting<GemmVersion, gemm_version, set_gemm_version>;
using ScopedGemmPlanningSms = ScopedGemmSetting<int, gemm_planning_sms, set_gemm_planning_sms>;
using ScopedGemmPersistentTiles =
    ScopedGemmSetting<bool, gemm_persistent_tiles, set_gemm_persistent_tiles>;

} // namespace minamp
