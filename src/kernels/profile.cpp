// The op profiler (see profile.h): CPU calls are added up as they end; GPU calls leave a pair of
// recorded events that collect() reads once the GPU has passed them.
#include "kernels/profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "kernels/backend.h"

namespace minamp::profile {

namespace {

// A GPU call whose events have not been read yet.
struct PendingGpuCall {
  const char* op;
  backend::CudaEvent* begin;
  backend::CudaEvent* end;
};

struct Recorder {
  bool enabled = false;
  std::mutex mutex; // guards pending and totals
  std::vector<PendingGpuCall> pending;
  std::map<std::pair<std::string, Device>, OpTime> totals;

  void add(const char* op, Device device, double ms) {
    OpTime& total = totals[{op, device}];
    total.op = op;
    total.device = device;
    ++total.calls;
    total.ms += ms;
  }
};

Recorder& recorder() {
  static Recorder instance;
  return instance;
}

// Open scopes on this thread: only the outermost one records.
thread_local int t_open_scopes = 0;

// `text` padded with spaces to `width` (on the left when `right`).
std::string pad(const std::string& text, size_t width, bool right = false) {
  if (text.size() >= width) return right ? " " + text : text + " ";
  const std::string spaces(width - text.size(), ' ');
  return right ? spaces + text : text + spaces;
}

std::string format_fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

double now_ms() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

} // namespace

void set_enabled(bool enabled) { recorder().enabled = enabled; }
bool enabled() { return recorder().enabled; }

std::vector<OpTime> collect() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  // Every event is destroyed exactly once, even when reading one fails (a faulted kernel): the
  // first failure is rethrown after the loop.
  const std::vector<PendingGpuCall> calls = std::move(r.pending);
  r.pending.clear();
  std::exception_ptr failure;
  for (const PendingGpuCall& call : calls) {
    try {
      if (!failure) r.add(call.op, Device::cuda, backend::cuda_elapsed_ms(call.begin, call.end));
    } catch (...) {
      failure = std::current_exception();
    }
    backend::cuda_destroy_event(call.begin);
    backend::cuda_destroy_event(call.end);
  }
  if (failure) std::rethrow_exception(failure);
  std::vector<OpTime> times;
  for (auto& entry : r.totals) times.push_back(std::move(entry.second));
  r.totals.clear();
  std::sort(times.begin(), times.end(),
            [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return times;
}

std::string format_table(const std::vector<OpTime>& times, int64_t steps,
                         const std::string& indent) {
  double total_ms = 0.0;
  for (const OpTime& t : times) total_ms += t.ms;
  const double per_step = 1.0 / double(std::max<int64_t>(steps, 1));
  std::string table =
      cat(indent, "op profile over ", steps, " steps: ", format_fixed(total_ms * per_step, 3),
          " ms per step inside ops\n");
  table += cat(indent, pad("op", 24), pad("device", 7), pad("calls/step", 11, true),
               pad("ms/step", 11, true), pad("share", 8, true), "\n");
  for (const OpTime& t : times)
    table += cat(
        indent, pad(t.op, 24), pad(t.device == Device::cuda ? "cuda" : "cpu", 7),
        pad(format_fixed(double(t.calls) * per_step, 1), 11, true),
        pad(format_fixed(t.ms * per_step, 4), 11, true),
        pad(format_fixed(total_ms > 0.0 ? 100.0 * t.ms / total_ms : 0.0, 1) + "%", 8, true), "\n");
  return table;
}

Scope::Scope(const char* op, Device device) : device_(device) {
  if (t_open_scopes == 0 && recorder().enabled) {
    if (device == Device::cuda)
      gpu_start_ = backend::cuda_record_event(); // may throw: then no scope is open
    else
      cpu_start_ms_ = now_ms();
    op_ = op;
  }
  ++t_open_scopes;
}

Scope::~Scope() {
  --t_open_scopes;
  if (!op_) return;
  Recorder& r = recorder();
  if (device_ == Device::cpu) {
    const double ms = now_ms() - cpu_start_ms_;
    std::lock_guard<std::mutex> lock(r.mutex);
    r.add(op_, device_, ms);
    return;
  }
  backend::CudaEvent* end = nullptr;
  try {
    end = backend::cuda_record_event();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.pending.push_back({op_, gpu_start_, end});
  } catch (const std::exception&) { // a failing device: the op's own error says why
    backend::cuda_destroy_event(gpu_start_);
    backend::cuda_destroy_event(end);
  }
}

} // namespace minamp::profile
