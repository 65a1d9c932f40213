// The process-wide choice of tensor-core GEMM version, of the SM count its planner plans for and
// of whether v5's large tiles run on a persistent grid (see gemm_version.h).
#include "kernels/gemm_version.h"

#include <atomic>
#include <cstdlib>

#include "core/error.h"

namespace minamp {

namespace {

constexpr GemmVersion kVersions[] = {GemmVersion::automatic, GemmVersion::v1_naive,
                                     GemmVersion::v2_wmma,   GemmVersion::v3_interior,
                                     GemmVersion::v4_mma,    GemmVersion::v5_multistage};

GemmVersion version_from_environment() {
  const char* value = std::getenv("MINAMP_GEMM_VERSION");
  if (!value || !*value) return GemmVersion::automatic;
  const std::optional<GemmVersion> version = parse_gemm_version(value);
  if (!version)
    throw Error(cat("MINAMP_GEMM_VERSION: expected auto, v1, v2, v3, v4 or v5, got '", value, "'"));
  return *version;
}

std::atomic<GemmVersion>& selected() {
  static std::atomic<GemmVersion> version{version_from_environment()};
  return version;
}

std::atomic<int>& planning_sms() {
  static std::atomic<int> sms{0};
  return sms;
}

bool persistent_tiles_from_environment() {
  const char* value = std::getenv("MINAMP_GEMM_PERSISTENT");
  if (!value || !*value) return false;
  const std::string text = value;
  if (text != "0" && text != "1")
    throw Error(cat("MINAMP_GEMM_PERSISTENT: expected 0 or 1, got '", text, "'"));
  return text == "1";
}

std::atomic<bool>& persistent_tiles() {
  static std::atomic<bool> on{persistent_tiles_from_environment()};
  return on;
}

} // namespace

const char* gemm_version_name(GemmVersion version) {
  switch (version) {
  case GemmVersion::automatic: return "auto";
  case GemmVersion::v1_naive: return "v1";
  case GemmVersion::v2_wmma: return "v2";
  case GemmVersion::v3_interior: return "v3";
  case GemmVersion::v4_mma: return "v4";
  case GemmVersion::v5_multistage: return "v5";
  }
  return "?";
}

std::optional<GemmVersion> parse_gemm_version(const std::string& name) {
  for (GemmVersion version : kVersions)
    if (name == gemm_version_name(version)) return version;
  return std::nullopt;
}

GemmVersion gemm_version() { return selected().load(std::memory_order_relaxed); }
void set_gemm_version(GemmVersion version) { selected().store(version, std::memory_order_relaxed); }

int gemm_planning_sms() { return planning_sms().load(std::memory_order_relaxed); }
void set_gemm_planning_sms(int sms) {
  require(sms >= 0, "gemm", "the planning SM count must be 0 (the GPU's) or positive, got ", sms);
  planning_sms().store(sms, std::memory_order_relaxed);
}

bool gemm_persistent_tiles() { return persistent_tiles().load(std::memory_order_relaxed); }
void set_gemm_persistent_tiles(bool on) { persistent_tiles().store(on, std::memory_order_relaxed); }

} // namespace minamp
