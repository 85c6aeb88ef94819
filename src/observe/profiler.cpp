#include "athanor/observe/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "athanor/core/device_hooks.h"
#include "athanor/core/error.h"
#include "athanor/core/observer.h"

namespace athanor::observe {
namespace detail {
std::atomic<bool> g_profiler_on{false};
}

namespace {
std::atomic<int64_t> g_origin_ns{0};  // steady-clock time of the origin
std::atomic<uint64_t> g_epoch{1};     // bumped by reset(): per-thread state from before is stale
std::atomic<int> g_next_tid{0};

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What one thread needs to turn hook calls into intervals.
struct ThreadState {
  int tid = g_next_tid.fetch_add(1);
  uint64_t epoch = 0;
  int64_t mark_ns = 0;                  // time of this thread's last event
  std::vector<int64_t> child_ns;        // per open span/node: time of the events recorded inside it
  int node_depth = 0;                   // open backward nodes (ops inside are not recorded)
  int device = -1;                      // set_device: the cuda device whose work is timed (-1: none)
  std::vector<int32_t> dev_open;        // indices (Shared::dev) of the open events with device marks
};
thread_local ThreadState t_state;

// Brings the thread's state up to date after a reset(); returns it.
ThreadState& state(int64_t now) {
  ThreadState& s = t_state;
  const uint64_t e = g_epoch.load(std::memory_order_relaxed);
  if (s.epoch != e) {
    s.epoch = e;
    s.mark_ns = now;
    s.child_ns.clear();
    s.node_depth = 0;
    s.dev_open.clear();
  }
  return s;
}

int64_t pop_children(ThreadState& s) {
  if (s.child_ns.empty()) return 0;  // opened before a reset()
  const int64_t c = s.child_ns.back();
  s.child_ns.pop_back();
  return c;
}
void charge_parent(ThreadState& s, int64_t dur) {
  if (!s.child_ns.empty()) s.child_ns.back() += dur;
}

// An event's two device marks, resolved into device times lazily (resolve_device_locked).
struct DeviceRecord {
  std::uint64_t begin = 0, end = 0;  // marks (end 0: still open)
  int32_t parent = -1;               // the enclosing event with marks, on the same thread
  int device = 0;
  std::string key, name, category;   // the row's key; the trace's name and category
  bool resolved = false;
  int64_t dur_ns = 0, begin_ns = 0;  // device duration; begin on the profiler's clock
};

struct Shared {
  std::mutex mu;
  std::unordered_map<std::string, ProfileRow> rows;  // key: kind + name
  std::vector<ProfileEvent> events;
  size_t dropped = 0;
  int64_t profiled_ns = 0;
  std::vector<DeviceRecord> dev;
  size_t dev_resolved = 0;           // records [0, dev_resolved) are resolved or dropped
  std::uint64_t dev_origin = 0;      // the first mark (per reset), and its host time
  int64_t dev_origin_ns = 0;
  int64_t device_profiled_ns = 0;
};
Shared& shared() {
  static Shared s;
  return s;
}

const char* kind_name(char k) { return k == 'f' ? "fwd" : k == 'b' ? "bwd" : "span"; }

DeviceHooks* cuda_hooks() { return device_hooks(DeviceType::cuda); }

// The begin mark of an event of this thread when it times a device (set_device), as an open
// record; nothing otherwise.
void device_begin(ThreadState& s, int64_t now) {
  if (s.device < 0) return;
  DeviceHooks* h = cuda_hooks();
  if (!h) return;
  const std::uint64_t m = h->record_mark(s.device);
  if (!m) return;
  Shared& sh = shared();
  std::lock_guard<std::mutex> lock(sh.mu);
  if (!sh.dev_origin) {
    sh.dev_origin = h->record_mark(s.device);
    sh.dev_origin_ns = now;
  }
  DeviceRecord r;
  r.begin = m;
  r.parent = s.dev_open.empty() ? -1 : s.dev_open.back();
  r.device = s.device;
  sh.dev.push_back(std::move(r));
  s.dev_open.push_back(static_cast<int32_t>(sh.dev.size() - 1));
}
// Its end mark, closing the record opened by device_begin.
void device_end(ThreadState& s, char kind, const std::string& name, const std::string& category) {
  if (s.device < 0 || s.dev_open.empty()) return;
  DeviceHooks* h = cuda_hooks();
  const std::uint64_t m = h ? h->record_mark(s.device) : 0;
  Shared& sh = shared();
  std::lock_guard<std::mutex> lock(sh.mu);
  const int32_t i = s.dev_open.back();
  s.dev_open.pop_back();
  if (i < 0 || static_cast<size_t>(i) >= sh.dev.size()) return;  // recorded before a reset()
  DeviceRecord& r = sh.dev[static_cast<size_t>(i)];
  r.end = m;
  r.key = std::string(1, kind) + name;
  r.name = name;
  r.category = category;
}

// Resolves the closed records not yet resolved into the rows' device times (waits for the
// device once, at the latest of them). Records still open stay for a later call.
void resolve_device_locked(Shared& sh) {
  DeviceHooks* h = cuda_hooks();
  if (!h) return;
  size_t k = sh.dev_resolved;
  while (k < sh.dev.size() && sh.dev[k].end) ++k;  // in begin order: stop at the first still open
  for (size_t i = sh.dev_resolved; i < k; ++i) {
    DeviceRecord& r = sh.dev[i];
    r.dur_ns = std::max<int64_t>(0, h->mark_elapsed_ns(r.begin, r.end));
    r.begin_ns = sh.dev_origin_ns + h->mark_elapsed_ns(sh.dev_origin, r.begin);
    r.resolved = true;
    ProfileRow& row = sh.rows[r.key];
    ++row.device_calls;
    row.device_total_ns += r.dur_ns;
    row.device_self_ns += r.dur_ns;
    sh.device_profiled_ns += r.dur_ns;
    if (r.parent >= 0) {  // a nested event's time is not its parent's self time
      DeviceRecord& p = sh.dev[static_cast<size_t>(r.parent)];
      sh.rows[p.key.empty() ? std::string("s(open)") : p.key].device_self_ns -= r.dur_ns;
      sh.device_profiled_ns -= r.dur_ns;
    }
  }
  for (size_t i = sh.dev_resolved; i < k; ++i) {  // the marks go back once nothing needs them
    h->release_mark(sh.dev[i].begin);
    h->release_mark(sh.dev[i].end);
    sh.dev[i].begin = sh.dev[i].end = 0;
  }
  sh.dev_resolved = k;
}

void release_device_locked(Shared& sh) {
  if (DeviceHooks* h = cuda_hooks()) {
    for (size_t i = sh.dev_resolved; i < sh.dev.size(); ++i) {
      h->release_mark(sh.dev[i].begin);
      h->release_mark(sh.dev[i].end);
    }
    h->release_mark(sh.dev_origin);
  }
  sh.dev.clear();
  sh.dev_resolved = 0;
  sh.dev_origin = 0;
  sh.device_profiled_ns = 0;
}

// The profiler as the core observer hook: the op dispatch and the backward engine notify it
// without including it (they sit below observe in the layer order).
class ProfilerHook final : public OpObserver {
 public:
  int64_t op_begin(const char*) override { return Profiler::enabled() ? Profiler::instance().begin_op() : -1; }
  void op_end(const char* op, int64_t begin) override {
    if (begin >= 0) Profiler::instance().end_op(op, begin);
  }
  int64_t node_begin(const std::string&) override { return Profiler::enabled() ? Profiler::instance().begin_node() : -1; }
  void node_end(const std::string& node, int64_t begin) override {
    if (begin >= 0) Profiler::instance().end_node(node, begin);
  }
  int64_t span_begin(const char*) override { return Profiler::enabled() ? Profiler::instance().begin_span() : -1; }
  void span_end(const char* name, const char* category, int64_t begin) override {
    if (begin >= 0) Profiler::instance().end_span(name, category, begin);
  }
};
ProfilerHook g_hook;
}  // namespace

Profiler& Profiler::instance() {
  static Profiler p;
  return p;
}

int64_t Profiler::now_ns() { return steady_ns() - g_origin_ns.load(std::memory_order_relaxed); }

void Profiler::start() {
  {
    std::lock_guard<std::mutex> lock(shared().mu);
    if (shared().rows.empty() && shared().events.empty()) {
      g_origin_ns.store(steady_ns(), std::memory_order_relaxed);
      g_epoch.fetch_add(1);  // marks taken against the old origin are stale
    }
  }
  state(now_ns()).mark_ns = now_ns();  // the calling thread's first op is not charged the time before start()
  set_op_observer(&g_hook);
  detail::g_profiler_on.store(true, std::memory_order_relaxed);
}

void Profiler::stop() { detail::g_profiler_on.store(false, std::memory_order_relaxed); }

void Profiler::reset() {
  std::lock_guard<std::mutex> lock(shared().mu);
  Shared& sh = shared();
  sh.rows.clear();
  sh.events.clear();
  sh.events.shrink_to_fit();
  sh.dropped = 0;
  sh.profiled_ns = 0;
  release_device_locked(sh);
  g_epoch.fetch_add(1);
  g_origin_ns.store(steady_ns(), std::memory_order_relaxed);
}

void Profiler::add_event(ProfileEvent e) {
  std::lock_guard<std::mutex> lock(shared().mu);
  Shared& sh = shared();
  std::string key(1, e.kind);
  key += e.name;
  ProfileRow& r = sh.rows[key];
  if (r.calls == 0) {
    r.name = e.name;
    r.kind = e.kind;
  }
  ++r.calls;
  r.total_ns += e.dur_ns;
  r.self_ns += e.self_ns;
  sh.profiled_ns += e.self_ns;
  if (sh.events.size() < max_trace_events()) sh.events.push_back(std::move(e));
  else ++sh.dropped;
}

int64_t Profiler::begin_op() {
  const int64_t now = now_ns();
  ThreadState& s = state(now);
  if (s.node_depth > 0) return -1;  // part of a backward node's time
  s.child_ns.push_back(0);
  s.mark_ns = now;
  device_begin(s, now);
  return now;
}

void Profiler::end_op(const char* name, int64_t begin_ns) {
  const int64_t now = now_ns();
  ThreadState& s = state(now);
  const int64_t dur = std::max<int64_t>(0, now - begin_ns);
  const int64_t self = std::max<int64_t>(0, dur - pop_children(s));
  s.mark_ns = now;
  charge_parent(s, dur);
  device_end(s, 'f', name, "op");
  add_event({name, "op", 'f', begin_ns, dur, self, s.tid});
}

int64_t Profiler::begin_node() {
  const int64_t now = now_ns();
  ThreadState& s = state(now);
  ++s.node_depth;
  s.child_ns.push_back(0);
  device_begin(s, now);
  return now;
}

void Profiler::end_node(const std::string& node_name, int64_t begin_ns) {
  const int64_t now = now_ns();
  ThreadState& s = state(now);
  if (s.node_depth > 0) --s.node_depth;
  const int64_t dur = std::max<int64_t>(0, now - begin_ns);
  const int64_t self = std::max<int64_t>(0, dur - pop_children(s));
  s.mark_ns = now;
  charge_parent(s, dur);
  const bool suffixed = node_name.size() >= 8 && node_name.compare(node_name.size() - 8, 8, "backward") == 0;
  const bool plain_node = node_name == "AccumulateGrad" || suffixed;
  const std::string name = plain_node ? node_name : node_name + "_backward";
  device_end(s, 'b', name, "backward");
  add_event({name, "backward", 'b', begin_ns, dur, self, s.tid});
}

int64_t Profiler::begin_span() {
  const int64_t now = now_ns();
  ThreadState& s = state(now);
  s.child_ns.push_back(0);
  s.mark_ns = now;
  device_begin(s, now);
  return now;
}

void Profiler::end_span(const std::string& name, const std::string& category, int64_t begin_ns) {
  const int64_t now = now_ns();
  ThreadState& s = state(now);
  const int64_t dur = std::max<int64_t>(0, now - begin_ns);
  const int64_t self = std::max<int64_t>(0, dur - pop_children(s));
  s.mark_ns = now;
  charge_parent(s, dur);
  device_end(s, 's', name, category);
  add_event({name, category, 's', begin_ns, dur, self, s.tid});
}

void Profiler::set_device(Device device) {
  ThreadState& s = state(now_ns());
  if (device.is_cpu()) {
    s.device = -1;
    return;
  }
  require_device_hooks(device, "profiler");  // cuda:7 on a one-GPU machine: an error now
  s.device = device.index;
}

int64_t Profiler::device_profiled_ns() const {
  std::lock_guard<std::mutex> lock(shared().mu);
  resolve_device_locked(shared());
  return shared().device_profiled_ns;
}

std::vector<DeviceProfileEvent> Profiler::device_events() const {
  std::lock_guard<std::mutex> lock(shared().mu);
  Shared& sh = shared();
  resolve_device_locked(sh);
  std::vector<DeviceProfileEvent> out;
  for (size_t i = 0; i < sh.dev_resolved && i < max_trace_events(); ++i) {
    const DeviceRecord& r = sh.dev[i];
    if (r.resolved) out.push_back({r.name, r.category, r.device, r.begin_ns, r.dur_ns});
  }
  return out;
}

std::vector<ProfileRow> Profiler::rows() const {
  std::vector<ProfileRow> out;
  {
    std::lock_guard<std::mutex> lock(shared().mu);
    resolve_device_locked(shared());
    for (const auto& [k, r] : shared().rows)
      if (r.calls > 0) out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const ProfileRow& a, const ProfileRow& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  return out;
}

int64_t Profiler::profiled_ns() const {
  std::lock_guard<std::mutex> lock(shared().mu);
  return shared().profiled_ns;
}

std::vector<ProfileEvent> Profiler::events() const {
  std::lock_guard<std::mutex> lock(shared().mu);
  return shared().events;
}

size_t Profiler::dropped_events() const {
  std::lock_guard<std::mutex> lock(shared().mu);
  return shared().dropped;
}

std::string Profiler::table(size_t max_rows) const {
  const std::vector<ProfileRow> all = rows();  // resolves the device times first
  const int64_t profiled = profiled_ns(), device = device_profiled_ns();
  bool timed = false;  // a device column only when some event timed a device
  for (const ProfileRow& r : all) timed = timed || r.device_calls > 0;
  size_t wname = 4;
  for (size_t i = 0; i < all.size() && i < max_rows; ++i) wname = std::max(wname, all[i].name.size());
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s  %-4s  %8s  %10s  %10s  %10s  %6s", static_cast<int>(wname), "name", "kind",
                "calls", "total ms", "self ms", "avg us", "% self");
  o << line;
  if (timed) {
    std::snprintf(line, sizeof line, "  %10s  %11s  %6s", "device ms", "dev self ms", "% dev");
    o << line;
  }
  o << "\n";
  for (size_t i = 0; i < all.size() && i < max_rows; ++i) {
    const ProfileRow& r = all[i];
    std::snprintf(line, sizeof line, "%-*s  %-4s  %8lld  %10.3f  %10.3f  %10.1f  %5.1f%%", static_cast<int>(wname),
                  r.name.c_str(), kind_name(r.kind), static_cast<long long>(r.calls), r.total_ns / 1e6, r.self_ns / 1e6,
                  r.calls ? r.total_ns / 1e3 / r.calls : 0.0, profiled > 0 ? 100.0 * r.self_ns / profiled : 0.0);
    o << line;
    if (timed && r.device_calls > 0) {
      std::snprintf(line, sizeof line, "  %10.3f  %11.3f  %5.1f%%", r.device_total_ns / 1e6, r.device_self_ns / 1e6,
                    device > 0 ? 100.0 * r.device_self_ns / device : 0.0);
      o << line;
    } else if (timed) {
      o << "  " << std::string(10, ' ') << "  " << std::string(11, ' ') << "  " << std::string(6, ' ');
    }
    o << "\n";
  }
  if (all.size() > max_rows) o << "(" << all.size() - max_rows << " more rows)\n";
  o << "profiled time (sum of self times): " << profiled / 1e6 << " ms";
  if (timed) o << "; device time (sum of device self times): " << device / 1e6 << " ms";
  if (const size_t d = dropped_events()) o << "; " << d << " events not kept for the trace";
  o << "\n";
  return o.str();
}

namespace {
// The device events as trace events on one track per device ("GPU cuda:i"), at `origin_us`.
void add_device_track(nlohmann::json& events, const std::vector<DeviceProfileEvent>& dev, int pid, double origin_us) {
  std::vector<int> named;
  for (const DeviceProfileEvent& e : dev) {
    const int tid = 1000 + e.device;
    if (std::find(named.begin(), named.end(), e.device) == named.end()) {
      named.push_back(e.device);
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid},
                        {"args", {{"name", "GPU cuda:" + std::to_string(e.device)}}}});
    }
    events.push_back({{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"ts", origin_us + e.begin_ns / 1e3},
                      {"dur", e.dur_ns / 1e3}, {"pid", pid}, {"tid", tid}});
  }
}
}  // namespace

void Profiler::write_chrome_trace(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  const int pid = static_cast<int>(::getpid());
  for (const ProfileEvent& e : this->events())
    events.push_back({{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"ts", e.begin_ns / 1e3},
                      {"dur", e.dur_ns / 1e3}, {"pid", pid}, {"tid", e.tid}});
  add_device_track(events, device_events(), pid, 0.0);
  std::ofstream f(path);
  ATH_CHECK(f.good(), "profiler", "cannot write the trace file '", path, "'",
            Hint{"check that the directory exists and is writable"});
  f << nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  ATH_CHECK(f.good(), "profiler", "writing the trace file '", path, "' failed", Hint{"check free disk space"});
}

std::string Profiler::trace_events(int pid, const std::string& track) const {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", track}}}});
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  const double origin_us = static_cast<double>(g_origin_ns.load(std::memory_order_relaxed)) / 1e3;
  for (const ProfileEvent& e : this->events())
    events.push_back({{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"ts", origin_us + e.begin_ns / 1e3},
                      {"dur", e.dur_ns / 1e3}, {"pid", pid}, {"tid", e.tid}});
  add_device_track(events, device_events(), pid, origin_us);
  return events.dump();
}

void write_merged_chrome_trace(const std::string& path, const std::vector<std::string>& arrays) {
  nlohmann::json all = nlohmann::json::array();
  double t0 = 0;
  bool any = false;
  std::vector<nlohmann::json> parsed;
  for (const auto& a : arrays) {
    parsed.push_back(nlohmann::json::parse(a));
    for (const auto& e : parsed.back())
      if (e.contains("ts")) {
        t0 = any ? std::min(t0, e["ts"].get<double>()) : e["ts"].get<double>();
        any = true;
      }
  }
  for (auto& p : parsed)
    for (auto& e : p) {
      if (e.contains("ts")) e["ts"] = e["ts"].get<double>() - t0;
      all.push_back(std::move(e));
    }
  std::ofstream f(path);
  ATH_CHECK(f.good(), "profiler", "cannot write the trace file '", path, "'", Hint{"check that the directory exists and is writable"});
  f << nlohmann::json{{"traceEvents", std::move(all)}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  ATH_CHECK(f.good(), "profiler", "writing the trace file '", path, "' failed", Hint{"check free disk space"});
}

}  // namespace athanor::observe
