#pragma once
// The op profiler: where a training step's time goes, per op (forward), per
// backward node and per named phase.
//
//   observe::Profiler::instance().start();
//   { observe::ProfileSpan s("forward", "phase"); loss = model.loss(x, y); }
//   { observe::ProfileSpan s("backward", "phase"); loss.backward(); }
//   observe::Profiler::instance().stop();
//   std::cout << observe::Profiler::instance().table();
//   observe::Profiler::instance().write_chrome_trace(run_dir + "/trace.json");   // open in Perfetto
//
// What is timed, and how (the profiler registers itself as the core observer hook,
// athanor/core/observer.h, on its first start()):
//  - forward ops: the op dispatch point (athanor/ops/registry.h) opens a span around every
//    op call, autocast's casts included; an op's self time is its duration minus the ops
//    nested in it (linear's casts, a composite's parts). Glue code between two ops (a
//    module's bookkeeping, allocating an input) is the enclosing span's self time.
//  - backward nodes: the engine times node->apply() with explicit begin/end
//    clock reads, named "<op>_backward" ("linear_backward"); ops that a
//    backward closure calls are part of the node's time, not listed separately.
//  - spans (ProfileSpan, RAII): begin/end clock reads; a span's self time is its
//    duration minus the time of everything recorded inside it on its thread.
// Self times of all events on a thread sum to the thread's profiled time, which
// is what the table's "%" column divides by.
//  - device time (set_device(cuda:i) on the thread that runs the step): every op, node and
//    span of that thread also records a timing event on the device's compute stream at its
//    begin and end (core/device_hooks.h: record_mark; never a wait). The pairs are resolved
//    lazily, when rows(), table() or a trace asks (one wait for the device then, never one
//    per op): an event's device time is the device time between its two marks, i.e. the
//    work it queued plus any idle gap while the device waited for the host; its device self
//    time excludes the events nested in it, so device self times sum to the device time the
//    profiled thread covered. The table shows both beside the host times; the Chrome trace
//    adds a "GPU cuda:i" track with the same events at their device times.
//
// Cost: when off, every hook is an atomic load, a virtual call and a predictable branch
// (no clock read). When on, an op, a span or a node costs two steady_clock reads, plus a
// mutex and a hash-map update. Measured on a GPT step
// (tests/observe/test_profiler.cpp, ProfilerOverhead prints it): see
// PROFILER_OVERHEAD_NOTE below.
//
// Thread safety: events from any thread (training, data-loader workers) may be
// recorded concurrently; per-thread state (the last-event mark, the open span
// stack) is thread-local, the shared tables are behind one mutex.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "athanor/core/device.h"

namespace athanor::observe {

// Measured overhead (see the header comment): written down by hand from
// `athanor_tests_observe --gtest_filter=ProfilerOverhead.*`.
inline constexpr const char* PROFILER_OVERHEAD_NOTE =
    "GPT step (2 layers, d 64, B 4, T 32, AdamW, 1 OpenMP thread; ~130 events/step), best of 8 steps: "
    "off 1.356-1.412 ms, on 1.361-1.404 ms: -1.8% .. +0.5% over 4 runs, i.e. within noise. "
    "Off costs one relaxed load + branch per op (no clock read).";

namespace detail {
extern std::atomic<bool> g_profiler_on;
}

// One timed interval, as written to the trace.
struct ProfileEvent {
  std::string name;
  std::string category;  // "op", "backward", or the span's category
  char kind = 'f';       // 'f' forward op, 'b' backward node, 's' span
  int64_t begin_ns = 0;  // since the profiler's origin (the first start() after reset())
  int64_t dur_ns = 0;
  int64_t self_ns = 0;
  int tid = 0;           // a small per-thread number (0 = the first thread seen)
};

// One row of the table: all events with the same name and kind.
struct ProfileRow {
  std::string name;
  char kind = 'f';
  int64_t calls = 0;
  int64_t total_ns = 0;
  int64_t self_ns = 0;
  // Device time (set_device): the events of this row that recorded device marks.
  int64_t device_calls = 0;
  int64_t device_total_ns = 0;
  int64_t device_self_ns = 0;
};

// One event's interval on the device (set_device), for the trace's GPU track.
struct DeviceProfileEvent {
  std::string name;
  std::string category;
  int device = 0;
  int64_t begin_ns = 0;  // on the profiler's clock: the first mark's host time + device time since it
  int64_t dur_ns = 0;
};

class Profiler {
 public:
  static Profiler& instance();

  void start();  // begins (or resumes) recording
  void stop();
  static bool enabled() { return detail::g_profiler_on.load(std::memory_order_relaxed); }
  void reset();  // forgets everything recorded (keeps the on/off state)
  // The calling thread's ops, nodes and spans also time the device's work from now on
  // (a cpu device, the default, turns it off). A build or device without timing marks
  // records none (the device columns stay empty).
  void set_device(Device device);

  static int64_t now_ns();  // steady clock, since the profiler's origin

  // Aggregates, sorted by total time (largest first).
  std::vector<ProfileRow> rows() const;
  // The rows as text: name, kind (fwd/bwd/span), calls, total ms, self ms, avg µs,
  // % of profiled time (by self time).
  std::string table(size_t max_rows = 40) const;
  // Sum of all self times = the profiled wall time, per thread, summed over threads.
  int64_t profiled_ns() const;
  // The sum of the device self times (0 without device timing).
  int64_t device_profiled_ns() const;
  std::vector<DeviceProfileEvent> device_events() const;
  // Events kept for the trace (capped at max_trace_events(); aggregates are always complete).
  std::vector<ProfileEvent> events() const;
  size_t dropped_events() const;
  static size_t max_trace_events() { return 2'000'000; }
  // Chrome trace-event JSON ({"traceEvents": [{"name","cat","ph":"X","ts","dur","pid","tid"}, …]},
  // times in µs): opens in Perfetto / chrome://tracing. Raises athanor::Error if the file cannot be written.
  void write_chrome_trace(const std::string& path) const;
  // The events as a Chrome-trace JSON array for one track (pid) named `track`, with absolute
  // steady-clock timestamps: the arrays of processes on one host line up.
  std::string trace_events(int pid, const std::string& track) const;

  // Used by the observer hook and ProfileSpan; prefer ProfileSpan.
  int64_t begin_op();  // returns the begin time, or -1 inside a backward node (not recorded)
  void end_op(const char* name, int64_t begin_ns);
  int64_t begin_node();  // returns the begin time
  void end_node(const std::string& node_name, int64_t begin_ns);
  int64_t begin_span();  // returns the begin time
  void end_span(const std::string& name, const std::string& category, int64_t begin_ns);

 private:
  Profiler() = default;
  void add_event(ProfileEvent e);
};

// RAII span: times a phase ("data_wait", "forward", "backward", "optimizer" with
// "grad_norm", "optimizer_step" and "zero_grad" inside it, "comm", anything). Free when
// the profiler is off.
class ProfileSpan {
 public:
  explicit ProfileSpan(std::string name, std::string category = "phase") {
    if (Profiler::enabled()) [[unlikely]] {
      active_ = true;
      name_ = std::move(name);
      category_ = std::move(category);
      begin_ns_ = Profiler::instance().begin_span();
    }
  }
  ~ProfileSpan() {
    if (active_) Profiler::instance().end_span(name_, category_, begin_ns_);
  }
  ProfileSpan(const ProfileSpan&) = delete;
  ProfileSpan& operator=(const ProfileSpan&) = delete;

 private:
  bool active_ = false;
  int64_t begin_ns_ = 0;
  std::string name_, category_;
};

// One trace of several processes (trace_events arrays, one per rank): a track each, shifted so
// that the earliest event starts at 0.
void write_merged_chrome_trace(const std::string& path, const std::vector<std::string>& event_arrays);

}  // namespace athanor::observe
