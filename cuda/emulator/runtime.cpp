// The CUDA emulator's host side: the CUDA runtime calls minamp makes, implemented on the CPU
// (memory, the stream, events, graph capture and replay, device attributes, errors), and the
// scheduler that runs a kernel launch: block after block (even blocks, then odd ones), each
// block's threads as cooperative fibers that switch at __syncthreads and warp-wide operations, warp
// after warp between barriers in alternating order. See emulator.h for what the emulator
// checks and what it cannot see.
//
// Work runs when it is issued (the stream is always idle), so events time the work between
// them on the host clock. The emulated device is an H100-like part: 132 SMs, 227 KB of
// shared memory per block, 80 GB of memory, 50 MB of L2.
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include "emulator.h"

namespace {

constexpr int kSmCount = 132;
constexpr int kDefaultSharedBytes = 48 * 1024;
constexpr int kOptinSharedBytes = 227 * 1024;
constexpr size_t kDeviceBytes = size_t(80) << 30;
constexpr int kL2Bytes = 50 << 20;
constexpr int kMaxBlockThreads = 1024;
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kFiberStackBytes = 1 << 20;
#else
constexpr size_t kFiberStackBytes = 256 << 10;
#endif

using Work = std::function<void()>;

} // namespace

// The opaque handle types of the runtime API.
struct CUstream_st {
  bool capturing = false;
  bool capture_invalidated = false;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  std::vector<Work> captured;
};
struct CUevent_st {
  bool timing = true;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
  uint64_t reads_before = 0; // pinned reads issued before the record (see PendingRead)
};
struct CUgraph_st {
  std::vector<Work> nodes;
};
struct CUgraphExec_st {
  std::vector<Work> nodes;
};

namespace minamp::emu {

thread_local ThreadCoordinates coordinates;

namespace {

// ---- Errors: the last one, as cudaGetLastError returns it, and the first fault of a launch.

cudaError_t last_error = cudaSuccess;
thread_local std::string launch_fault;

cudaError_t fail(cudaError_t error) {
  last_error = error;
  return error;
}

// ---- Fibers.

// A saved execution context and the switch between two. On x86-64 a hand-written switch saves
// what the ABI says a call preserves (rbx, rbp, r12-r15, the MXCSR and x87 control words) on
// the old stack and restores them from the new one: a few nanoseconds, where ucontext's
// swapcontext (used on other architectures) makes a signal-mask system call every time.
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
extern "C" void minamp_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl minamp_emu_switch
  .type minamp_emu_switch, @function
minamp_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size minamp_emu_switch, .-minamp_emu_switch
)");

// A context that starts `entry` (which must never return) on the stack [stack, stack + bytes).
void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  auto* top =
      reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15));
#if defined(__SANITIZE_ADDRESS__)
  // The stack's previous fiber ended inside fiber_main, whose frame never returned, so
  // AddressSanitizer may still hold redzones where this initial frame goes.
  __asan_unpoison_memory_region(top - 9, 9 * sizeof(uint64_t));
#endif
  top[-1] = 0;                                 // entry's return address: it never returns
  top[-2] = reinterpret_cast<uint64_t>(entry); // where the switch's `ret` goes
  for (int r = 3; r <= 8; ++r) top[-r] = 0;    // rbp, rbx, r12-r15
  top[-9] = 0x1f80 | (uint64_t(0x037f) << 32); // default MXCSR and x87 control word
  c.sp = top - 9;
}
void switch_context(Context& from, Context& to) { minamp_emu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

enum class FiberState { runnable, at_block_barrier, at_warp_barrier, done };

// A cp.async copy in flight: the source bytes, read when it was issued, land in `dst` at the
// wait that covers its group.
struct AsyncCopy {
  unsigned char* dst;
  size_t size;
  unsigned char bytes[16];
  int group; // the commit group it joins: the fiber's commit count when it was issued
};

struct Fiber {
  Context context;
  FiberState state = FiberState::runnable;
  int exchanges = 0;                   // warp_exchange calls so far: their parity picks the slots
  int collective_calls = 0;            // warp_collective_slot calls since the block's last barrier
  std::vector<AsyncCopy> async_copies; // issued and not landed, in issue order
  int async_commits = 0;               // cp.async.commit_group calls so far
  const char* barrier_file = nullptr;  // where the __syncthreads it waits at is
  int barrier_line = 0;
  void* sanitizer_stack = nullptr;
};

// Fiber stacks, reserved once per OS thread for the largest block seen, with a guard page below
// each so that an overflow faults instead of corrupting the neighbour.
class StackPool {
public:
  ~StackPool() {
    if (base_) munmap(base_, count_ * kFiberStackBytes);
  }
  char* stack(int i) {
    return static_cast<char*>(base_) + size_t(i) * kFiberStackBytes + page_bytes();
  }
  size_t usable_bytes() const { return kFiberStackBytes - page_bytes(); }
  void reserve(int count) {
    if (count <= count_) return;
    if (base_) munmap(base_, count_ * kFiberStackBytes);
    base_ = mmap(nullptr, count * kFiberStackBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base_ == MAP_FAILED) {
      std::perror("minamp CUDA emulator: reserving fiber stacks");
      std::abort();
    }
    count_ = count;
    for (int i = 0; i < count; ++i)
      mprotect(static_cast<char*>(base_) + size_t(i) * kFiberStackBytes, page_bytes(), PROT_NONE);
  }

private:
  static size_t page_bytes() { return size_t(sysconf(_SC_PAGESIZE)); }
  void* base_ = nullptr;
  int count_ = 0;
};

// Fills memory whose content a GPU leaves undefined (fresh allocations, shared memory, a cp.async
// destination before its wait) with all-ones bytes, which read as NaN in f32 and f16.
void fill_with_garbage(void* memory, size_t bytes) { std::memset(memory, 0xff, bytes); }

// `bytes` (one, for zero) of memory aligned to `alignment`, or nullptr when there is none.
// Exactly that many, unlike aligned_alloc's whole alignment units, so that under
// AddressSanitizer a kernel reading past the end of a cudaMalloc'd block is reported.
void* aligned_block(size_t bytes, size_t alignment) {
  void* block = nullptr;
  return posix_memalign(&block, alignment, std::max<size_t>(bytes, 1)) == 0 ? block : nullptr;
}

// A block's dynamic shared memory: 128-byte aligned, as `extern __shared__ __align__(128)` asks.
class SharedMemory {
public:
  void resize(size_t bytes) {
    bytes_ = bytes;
    memory_.reset(static_cast<unsigned char*>(aligned_block(bytes, 128)));
  }
  unsigned char* data() { return memory_.get(); }
  size_t size() const { return bytes_; }
  void poison() { fill_with_garbage(memory_.get(), bytes_); } // it starts as garbage on a GPU

private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> memory_;
  size_t bytes_ = 0;
};

// The block this OS thread is running.
struct Block {
  const Work* body = nullptr;
  std::vector<Fiber> fibers;
  // The warp-wide exchanges (shuffles, ldmatrix, mma.sync): [warps][2][32][kWarpExchangeBytes],
  // the two halves used in turn so that a lane may start the next exchange while the others
  // still read this one.
  std::vector<unsigned char> exchange_slots;
  SharedMemory shared;              // dynamic shared memory
  std::vector<void*> static_shared; // static __shared__ variables poisoned in this block
  // Per warp: the slots of warp_collective_slot since the last barrier, one after another.
  std::vector<std::vector<float>> collective_slots;
  std::vector<size_t> collective_count;
  Context scheduler;
  int current = -1;
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
};

thread_local StackPool stacks;
thread_local Block* running = nullptr;

// Stack switches announced to AddressSanitizer, which otherwise takes a fiber's stack for a
// corrupted one.
void before_switch(void** save, const void* bottom, size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(save, bottom, size);
#else
  (void)save, (void)bottom, (void)size;
#endif
}
void after_switch(void* save, const void** old_bottom, size_t* old_size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(save, old_bottom, old_size);
#else
  (void)save, (void)old_bottom, (void)old_size;
#endif
}

// From the running fiber back to the scheduler; returns when the scheduler resumes it.
void yield_to_scheduler(bool finished) {
  Block& b = *running;
  Fiber& f = b.fibers[b.current];
  before_switch(finished ? nullptr : &f.sanitizer_stack, b.scheduler_stack_bottom,
                b.scheduler_stack_size);
  switch_context(f.context, b.scheduler);
  after_switch(f.sanitizer_stack, &b.scheduler_stack_bottom, &b.scheduler_stack_size);
}

void fiber_main() {
  Block& b = *running;
  after_switch(nullptr, &b.scheduler_stack_bottom, &b.scheduler_stack_size);
  (*b.body)();
  if (!b.fibers[b.current].async_copies.empty())
    report_fault("cp.async: a thread finished with copies no cp.async.wait_group covered");
  b.fibers[b.current].state = FiberState::done;
  yield_to_scheduler(true); // never resumed
}

void resume(Block& b, int t) {
  const dim3 d = coordinates.block_dim;
  coordinates.thread_idx = make_uint3(t % d.x, (t / d.x) % d.y, t / (d.x * d.y));
  b.current = t;
  void* save = nullptr;
  before_switch(&save, stacks.stack(t), stacks.usable_bytes());
  switch_context(b.scheduler, b.fibers[t].context);
  after_switch(save, nullptr, nullptr);
}

// At a barrier the warps' collective slots start over.
void forget_collectives(Block& b) {
  for (Fiber& f : b.fibers) f.collective_calls = 0;
  std::fill(b.collective_count.begin(), b.collective_count.end(), 0);
}

// Releases the warp of `lanes` threads from warp0 when all its live lanes wait at a shuffle.
bool release_shuffle(Block& b, int warp0, int lanes) {
  int waiting = 0, finished = 0;
  for (int t = warp0; t < warp0 + lanes; ++t) {
    waiting += b.fibers[t].state == FiberState::at_warp_barrier;
    finished += b.fibers[t].state == FiberState::done;
  }
  if (waiting == 0 || waiting + finished != lanes) return false;
  if (waiting != 32)
    report_fault("warp: a full-warp operation (shuffle, ldmatrix, mma) without all 32 lanes");
  for (int t = warp0; t < warp0 + lanes; ++t)
    if (b.fibers[t].state == FiberState::at_warp_barrier) b.fibers[t].state = FiberState::runnable;
  return true;
}

// Runs a warp's lanes (in decreasing order when `backwards`) until each has finished or waits
// at __syncthreads, releasing the warp's shuffles as its lanes all reach them.
void run_warp(Block& b, int warp0, int lanes, bool backwards) {
  do {
    for (int i = 0; i < lanes; ++i) {
      const int t = warp0 + (backwards ? lanes - 1 - i : i);
      if (b.fibers[t].state == FiberState::runnable) resume(b, t);
    }
  } while (release_shuffle(b, warp0, lanes));
}

// True when the live threads all wait at the same __syncthreads; else reports which two.
bool same_barrier(const Block& b) {
  const Fiber* first = nullptr;
  for (const Fiber& f : b.fibers) {
    if (f.state != FiberState::at_block_barrier) continue;
    if (!first) {
      first = &f;
    } else if (f.barrier_line != first->barrier_line ||
               std::strcmp(f.barrier_file, first->barrier_file) != 0) {
      report_fault(("__syncthreads: the block's threads wait at different ones (" +
                    std::string(first->barrier_file) + ":" + std::to_string(first->barrier_line) +
                    " and " + f.barrier_file + ":" + std::to_string(f.barrier_line) + ")")
                       .c_str());
      return false;
    }
  }
  return true;
}

// After every warp ran: releases the block when every live thread waits at __syncthreads.
// Returns false when every thread has finished, or on a deadlock (reported): threads waiting
// at different barriers.
bool release_block(Block& b) {
  bool any_live = false, all_at_block = true;
  for (const Fiber& f : b.fibers) {
    if (f.state == FiberState::done) continue;
    any_live = true;
    all_at_block = all_at_block && f.state == FiberState::at_block_barrier;
  }
  if (!any_live) return false;
  if (!all_at_block) {
    report_fault("deadlock: the block's threads wait at different barriers (a __syncthreads or "
                 "shuffle that not every thread reaches)");
    return false;
  }
  if (!same_barrier(b)) return false;
  for (Fiber& f : b.fibers)
    if (f.state == FiberState::at_block_barrier) f.state = FiberState::runnable;
  forget_collectives(b);
  return true;
}

// Runs one block. Between two __syncthreads the warps run one after another, each to the
// barrier, in increasing order in one such phase and decreasing in the next (odd blocks start
// backwards), lanes likewise: a warp that writes what another warp still reads before the
// barrier, or any result that depends on the order of threads between barriers (a race),
// changes between phases or blocks and fails the comparison with the CPU reference.
void run_block(Block& b) {
  const int threads = int(b.fibers.size()), warps = (threads + 31) / 32;
  for (int t = 0; t < threads; ++t) {
    Fiber& f = b.fibers[t];
    f = Fiber{};
    make_context(f.context, stacks.stack(t), stacks.usable_bytes(), fiber_main);
  }
  forget_collectives(b);
  b.shared.poison();
  b.static_shared.clear();
  const uint3 id = coordinates.block_idx;
  const dim3 grid = coordinates.grid_dim;
  int phase = int((id.x + grid.x * (id.y + grid.y * id.z)) % 2);
  do {
    const bool backwards = phase++ % 2 == 1;
    for (int i = 0; i < warps; ++i) {
      const int warp = backwards ? warps - 1 - i : i;
      run_warp(b, warp * 32, std::min(32, threads - warp * 32), backwards);
    }
  } while (release_block(b));
}

void execute(dim3 grid, dim3 block, size_t shared_bytes, const Work& body) {
  const int threads = int(block.x * block.y * block.z);
  stacks.reserve(threads);
  Block b;
  b.body = &body;
  b.fibers.resize(threads);
  b.exchange_slots.assign(size_t((threads + 31) / 32) * 64 * kWarpExchangeBytes, 0);
  b.collective_slots.resize((threads + 31) / 32);
  b.collective_count.resize((threads + 31) / 32);
  b.shared.resize(shared_bytes);
  Block* outer = running;
  running = &b;
  coordinates.grid_dim = grid;
  coordinates.block_dim = block;
  launch_fault.clear();
  // Blocks are independent on a GPU, which runs them in any order: here the even ones (in
  // linear order) go first, upwards, then the odd ones downwards, so a block that reads what
  // its neighbour on either side writes sees it unwritten for half of the blocks.
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z, odd = blocks / 2;
  for (uint64_t i = 0; i < blocks && launch_fault.empty(); ++i) {
    const uint64_t linear = i < blocks - odd ? 2 * i : 2 * (blocks - 1 - i) + 1;
    coordinates.block_idx =
        make_uint3(unsigned(linear % grid.x), unsigned(linear / grid.x % grid.y),
                   unsigned(linear / (uint64_t(grid.x) * grid.y)));
    run_block(b);
  }
  running = outer;
  if (!launch_fault.empty()) {
    std::fprintf(stderr, "minamp CUDA emulator: kernel fault: %s\n", launch_fault.c_str());
    fail(cudaErrorLaunchFailure);
  }
}

// ---- Memory: device allocations are tracked so that copies can be checked against them.

std::map<uintptr_t, size_t>& device_allocations() {
  static auto* allocations = new std::map<uintptr_t, size_t>();
  return *allocations;
}
size_t device_bytes_in_use = 0;
// Each kernel's dynamic shared-memory limit, as raised by cudaFuncSetAttribute (48 KiB until
// then): per kernel, as on a GPU, so that a kernel that never raised its own limit cannot launch
// above 48 KiB because another kernel raised theirs.
std::map<const void*, int>& max_dynamic_shared_bytes() {
  static auto* limits = new std::map<const void*, int>();
  return *limits;
}
int max_dynamic_shared_bytes(const void* kernel) {
  const auto limit = max_dynamic_shared_bytes().find(kernel);
  return limit == max_dynamic_shared_bytes().end() ? kDefaultSharedBytes : limit->second;
}
// Captures in a mode other than relaxed: cudaMalloc is refused while there is one.
int strict_captures = 0;

// True when [p, p + bytes) lies inside one of `blocks` (start -> size).
bool is_inside(const std::map<uintptr_t, size_t>& blocks, const void* p, size_t bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  auto it = blocks.upper_bound(at);
  if (it == blocks.begin()) return false;
  --it;
  return at + bytes <= it->first + it->second;
}

// True when [p, p + bytes) lies inside one device allocation.
bool is_device_range(const void* p, size_t bytes) {
  return is_inside(device_allocations(), p, bytes);
}

// ---- Pinned host memory under copies in flight. On a GPU a cudaMemcpyAsync from pinned memory
// reads it later, so the host must not write or free the buffer until it has waited for the
// copy: an event recorded after it, or the stream. Copying at once would hide a buffer reused too
// early, so each copy from pinned memory keeps a snapshot of its source until the host has
// waited for it, and a change (or cudaFreeHost) before then is an error.

std::map<uintptr_t, size_t>& pinned_blocks() {
  static auto* blocks = new std::map<uintptr_t, size_t>();
  return *blocks;
}

struct PendingRead {
  const unsigned char* source;
  std::vector<unsigned char> snapshot;
  uint64_t number; // 1, 2, ... in issue order
};
std::vector<PendingRead>& pending_reads() {
  static auto* reads = new std::vector<PendingRead>();
  return *reads;
}
uint64_t reads_issued = 0;

// The error for pinned memory that the host `did` (wrote, frees) under a copy in flight.
cudaError_t pinned_misuse(const char* call, const char* did) {
  std::fprintf(stderr,
               "minamp CUDA emulator: %s: the host %s pinned memory that a cudaMemcpyAsync may "
               "still be reading (wait for an event recorded after the copy, or for the stream, "
               "first)\n",
               call, did);
  return fail(cudaErrorIllegalState);
}

// cudaSuccess, or the error (reported once) when the host has written pinned memory that a copy
// in flight may still read.
cudaError_t check_pending_reads(const char* call) {
  for (const PendingRead& r : pending_reads())
    if (std::memcmp(r.source, r.snapshot.data(), r.snapshot.size()) != 0) {
      pending_reads().clear();
      return pinned_misuse(call, "wrote");
    }
  return cudaSuccess;
}

// The host, in `call`, waits for every pinned read numbered up to `number`: cudaSuccess, or the
// error for a buffer it wrote under them meanwhile.
cudaError_t wait_for_reads(const char* call, uint64_t number) {
  const cudaError_t status = check_pending_reads(call);
  auto& reads = pending_reads();
  reads.erase(std::remove_if(reads.begin(), reads.end(),
                             [&](const PendingRead& r) { return r.number <= number; }),
              reads.end());
  return status;
}

// True when a copy in flight may still read the pinned block that starts at `block`.
bool is_being_read(const void* block) {
  const auto it = pinned_blocks().find(reinterpret_cast<uintptr_t>(block));
  if (it == pinned_blocks().end()) return false;
  const auto* begin = static_cast<const unsigned char*>(block);
  for (const PendingRead& r : pending_reads())
    if (r.source >= begin && r.source < begin + it->second) return true;
  return false;
}

CUstream_st& stream_of(cudaStream_t stream) {
  static CUstream_st null_stream;
  return stream ? *stream : null_stream;
}

// Runs `work` now, or records it when `stream` is capturing.
void issue(cudaStream_t stream, Work work) {
  CUstream_st& s = stream_of(stream);
  if (s.capturing)
    s.captured.push_back(std::move(work));
  else
    work();
}

// A host-synchronising call during a capture invalidates it, as on a GPU.
bool refuse_while_capturing(cudaStream_t stream) {
  CUstream_st& s = stream_of(stream);
  if (!s.capturing) return false;
  s.capture_invalidated = true;
  fail(cudaErrorStreamCaptureUnsupported);
  return true;
}

} // namespace

void report_fault(const char* what) {
  if (launch_fault.empty()) launch_fault = what;
}

void sync_block(const char* file, int line) {
  Fiber& f = running->fibers[running->current];
  f.barrier_file = file;
  f.barrier_line = line;
  f.state = FiberState::at_block_barrier;
  yield_to_scheduler(false);
}

const unsigned char* warp_exchange(const void* mine, size_t bytes) {
  Block& b = *running;
  Fiber& f = b.fibers[b.current];
  const int warp = b.current / 32, lane = b.current % 32;
  if (bytes > kWarpExchangeBytes) report_fault("warp_exchange: more bytes than a lane's slot");
  unsigned char* slots =
      &b.exchange_slots[size_t(warp * 2 + (f.exchanges++ & 1)) * 32 * kWarpExchangeBytes];
  if (bytes > 0)
    std::memcpy(slots + size_t(lane) * kWarpExchangeBytes, mine,
                std::min(bytes, kWarpExchangeBytes));
  f.state = FiberState::at_warp_barrier;
  yield_to_scheduler(false);
  return slots;
}

uint64_t shuffle_xor(uint64_t value, int lane_mask) {
  const unsigned char* slots = warp_exchange(&value, sizeof(value));
  const int lane = running->current % 32;
  std::memcpy(&value, slots + size_t((lane ^ lane_mask) & 31) * kWarpExchangeBytes, sizeof(value));
  return value;
}

bool in_dynamic_shared_memory(const void* p, size_t bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t base = reinterpret_cast<uintptr_t>(running->shared.data());
  return at >= base && at + bytes <= base + running->shared.size();
}

float* warp_collective_slot(size_t floats, bool& first) {
  Block& b = *running;
  const int warp = b.current / 32;
  const size_t index = size_t(b.fibers[b.current].collective_calls++);
  std::vector<float>& slots = b.collective_slots[warp];
  first = index == b.collective_count[warp];
  if (first) {
    ++b.collective_count[warp];
    if (slots.size() < (index + 1) * floats) slots.resize((index + 1) * floats);
  }
  return slots.data() + index * floats;
}

void static_shared_memory(void* variable, size_t bytes) {
  std::vector<void*>& seen = running->static_shared;
  if (std::find(seen.begin(), seen.end(), variable) != seen.end()) return;
  seen.push_back(variable);
  fill_with_garbage(variable, bytes);
}

void check_launch_bounds(int max_threads, int, int) {
  const dim3 d = coordinates.block_dim;
  if (uint64_t(d.x) * d.y * d.z > uint64_t(max_threads))
    report_fault("launch: more threads per block than the kernel's __launch_bounds__ allow");
}

void* dynamic_shared_memory_base() { return running->shared.data(); }

void cp_async(void* shared_dst, const void* global_src, size_t bytes) {
  Block& b = *running;
  Fiber& f = b.fibers[b.current];
  unsigned char* dst = static_cast<unsigned char*>(shared_dst);
  const uintptr_t dst_at = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t shared_at = reinterpret_cast<uintptr_t>(b.shared.data());
  if (bytes != 4 && bytes != 8 && bytes != 16)
    return report_fault("cp.async: the copy size must be 4, 8 or 16 bytes");
  if (dst_at % bytes != 0 || reinterpret_cast<uintptr_t>(global_src) % bytes != 0)
    return report_fault("cp.async: a pointer is not aligned to the copy size");
  if (!is_device_range(global_src, bytes))
    return report_fault("cp.async: the source is not inside a device allocation");
  if (dst_at < shared_at || dst_at + bytes > shared_at + b.shared.size())
    return report_fault("cp.async: the destination is not in the block's dynamic shared memory "
                        "(the only shared memory the emulator's cp.async writes)");
  AsyncCopy copy{dst, bytes, {}, f.async_commits};
  std::memcpy(copy.bytes, global_src, bytes);
  f.async_copies.push_back(copy);
  fill_with_garbage(dst, bytes); // undefined until the copy lands
}

void cp_async_commit() { ++running->fibers[running->current].async_commits; }

void cp_async_wait(int pending_groups) {
  Fiber& f = running->fibers[running->current];
  const int landed_groups = f.async_commits - pending_groups; // groups 0 .. landed_groups - 1
  auto copy = f.async_copies.begin();
  for (; copy != f.async_copies.end() && copy->group < landed_groups; ++copy)
    std::memcpy(copy->dst, copy->bytes, copy->size);
  f.async_copies.erase(f.async_copies.begin(), copy);
}

void launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            Work thread_body) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > kMaxBlockThreads || block.z > 64 || grid.x == 0 ||
      grid.x > 2147483647u || grid.y == 0 || grid.y > 65535 || grid.z == 0 || grid.z > 65535) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  if (const int limit = max_dynamic_shared_bytes(kernel); shared_bytes > size_t(limit)) {
    std::fprintf(stderr,
                 "minamp CUDA emulator: a launch asks for %zu bytes of dynamic shared memory, "
                 "above the %d this kernel allows (cudaFuncSetAttribute on it raises it)\n",
                 shared_bytes, limit);
    fail(cudaErrorInvalidValue);
    return;
  }
  issue(stream, [=, body = std::move(thread_body)] { execute(grid, block, shared_bytes, body); });
}

} // namespace minamp::emu

// ---- The runtime API.

using namespace minamp::emu;

extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() { return last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorIllegalState: return "cudaErrorIllegalState";
  case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
  case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorLaunchFailure: return "unspecified launch failure (emulator: see the fault above)";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorIllegalState: return "the operation is not permitted in the current state";
  case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
  case cudaErrorStreamCaptureInvalidated:
    return "operation failed due to a previous error during capture";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  default: return "unknown error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop || device != 0) return fail(cudaErrorInvalidValue);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "minamp CUDA emulator (H100-like)");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = kSmCount;
  prop->totalGlobalMem = kDeviceBytes;
  prop->sharedMemPerBlock = kDefaultSharedBytes;
  prop->sharedMemPerBlockOptin = kOptinSharedBytes;
  prop->l2CacheSize = kL2Bytes;
  prop->maxThreadsPerBlock = kMaxBlockThreads;
  prop->warpSize = 32;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return fail(cudaErrorInvalidValue);
  switch (attr) {
  case cudaDevAttrMultiProcessorCount: *value = kSmCount; return cudaSuccess;
  case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
  case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
  case cudaDevAttrMaxSharedMemoryPerBlock: *value = kDefaultSharedBytes; return cudaSuccess;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = kOptinSharedBytes; return cudaSuccess;
  default: return fail(cudaErrorInvalidValue);
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return fail(cudaErrorInvalidValue);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > kOptinSharedBytes) return fail(cudaErrorInvalidValue);
  max_dynamic_shared_bytes()[func] = value;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (refuse_while_capturing(nullptr)) return cudaErrorStreamCaptureUnsupported;
  return wait_for_reads("cudaDeviceSynchronize", reads_issued);
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (strict_captures > 0) return fail(cudaErrorStreamCaptureUnsupported);
  if (bytes > kDeviceBytes - device_bytes_in_use) return fail(cudaErrorMemoryAllocation);
  void* memory = aligned_block(bytes, 256);
  if (!memory) return fail(cudaErrorMemoryAllocation);
  fill_with_garbage(memory, bytes);
  device_allocations()[reinterpret_cast<uintptr_t>(memory)] = bytes;
  device_bytes_in_use += bytes;
  *p = memory;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  auto& allocations = device_allocations();
  const auto it = allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocations.end()) return fail(cudaErrorInvalidValue);
  device_bytes_in_use -= it->second;
  allocations.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = aligned_block(bytes, 256);
  if (!*p) return fail(cudaErrorMemoryAllocation);
  pinned_blocks()[reinterpret_cast<uintptr_t>(*p)] = bytes;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  if (is_being_read(p)) return pinned_misuse("cudaFreeHost", "frees");
  pinned_blocks().erase(reinterpret_cast<uintptr_t>(p));
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((dst_device && !is_device_range(dst, bytes)) ||
      (src_device && !is_device_range(src, bytes))) {
    std::fprintf(stderr,
                 "minamp CUDA emulator: cudaMemcpyAsync of %zu bytes leaves a device "
                 "allocation (or names host memory as device memory)\n",
                 bytes);
    return fail(cudaErrorInvalidValue);
  }
  const cudaError_t status = check_pending_reads("cudaMemcpyAsync");
  if (status != cudaSuccess) return status;
  issue(stream, [=] { std::memcpy(dst, src, bytes); });
  if (!src_device && is_inside(pinned_blocks(), src, bytes)) {
    const auto* source = static_cast<const unsigned char*>(src);
    pending_reads().push_back({source, {source, source + bytes}, ++reads_issued});
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = new CUstream_st();
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (refuse_while_capturing(stream)) return cudaErrorStreamCaptureUnsupported;
  return wait_for_reads("cudaStreamSynchronize", reads_issued); // one stream: every copy so far
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  CUstream_st& s = stream_of(stream);
  if (s.capturing || !stream) return fail(cudaErrorIllegalState);
  s = CUstream_st{};
  s.capturing = true;
  s.capture_mode = mode;
  strict_captures += mode != cudaStreamCaptureModeRelaxed;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUstream_st& s = stream_of(stream);
  *graph = nullptr;
  if (!s.capturing) return fail(cudaErrorIllegalState);
  s.capturing = false;
  strict_captures -= s.capture_mode != cudaStreamCaptureModeRelaxed;
  if (s.capture_invalidated) {
    s.captured.clear();
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::move(s.captured)};
  s.captured.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  const CUstream_st& s = stream_of(stream);
  *status = !s.capturing            ? cudaStreamCaptureStatusNone
            : s.capture_invalidated ? cudaStreamCaptureStatusInvalidated
                                    : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec) return fail(cudaErrorInvalidValue);
  issue(stream, [exec] {
    for (const Work& node : exec->nodes) node();
  });
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  *event = new CUevent_st();
  (*event)->timing = (flags & cudaEventDisableTiming) == 0;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  event->reads_before = reads_issued;
  issue(stream, [event] {
    event->recorded = true;
    event->when = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  return wait_for_reads("cudaEventSynchronize", event->reads_before);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end || !start->timing || !end->timing || !start->recorded || !end->recorded)
    return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

} // extern "C"
