// The profiler's device times (observe/profiler.h: set_device) on the CPU: fake cuda hooks
// hand out timing marks on a device clock the test advances, so the bookkeeping is checked
// without a GPU — marks recorded at each event's begin and end on the thread that set the
// device only, resolved lazily (none while recording), device self times that exclude nested
// events and sum to the covered device time, the table's device columns, and the GPU track
// of the Chrome trace. (tests/gpu/test_gpu_profiler.cpp does the same with CUDA events.)
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "athanor/core/device_hooks.h"
#include "athanor/observe/profiler.h"
#include "test_util.h"

using namespace athanor;
using observe::ProfileSpan;
using observe::Profiler;

namespace {

// Only what the profiler calls: marks on a fake device clock (ns).
struct FakeTimingHooks final : DeviceHooks {
  int64_t clock = 0;
  std::map<std::uint64_t, int64_t> marks;  // handle -> the clock when recorded
  std::uint64_t next = 1;
  int recorded = 0, resolved = 0, released = 0;
  void check_device(int, const char*) override {}
  void* allocate(int, std::size_t, MemTag) override { return nullptr; }
  void deallocate(int, void*) override {}
  void retag(int, void*, MemTag) override {}
  void copy_to_device(void*, int, const void*, std::size_t) override {}
  void copy_to_host(void*, const void*, int, std::size_t) override {}
  void copy_between(void*, int, const void*, int, std::size_t) override {}
  void copy_strided(const StridedRegion&, const StridedRegion&, int, const char*) override {}
  void fill(const StridedRegion&, double, int) override {}
  void add_into(void*, const void*, DType, int64_t, int, const char*) override {}
  std::uint64_t record_mark(int) override {
    ++recorded;
    marks[next] = clock;
    return next++;
  }
  int64_t mark_elapsed_ns(std::uint64_t a, std::uint64_t b) override {
    ++resolved;
    return marks.at(b) - marks.at(a);
  }
  void release_mark(std::uint64_t m) override {
    if (m) ++released;
  }
};

// Installs the fake for the test, then the previous hooks (the real CUDA ones in a CUDA build).
struct HooksScope {
  DeviceHooks* saved = device_hooks(DeviceType::cuda);
  explicit HooksScope(DeviceHooks* h) { set_device_hooks(DeviceType::cuda, h); }
  ~HooksScope() { set_device_hooks(DeviceType::cuda, saved); }
};

const observe::ProfileRow* row(const std::vector<observe::ProfileRow>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

}  // namespace

TEST(ProfilerDevice, NestedEventsGetDeviceSelfTimesResolvedLazily) {
  FakeTimingHooks fake;
  HooksScope scope(&fake);
  Profiler& p = Profiler::instance();
  p.reset();
  p.set_device(Device::cuda(0));
  p.start();
  // Each mark takes the fake clock when its begin or end runs: step [0, 350], fwd_phase
  // [100, 350], gemm [100, 150] (advancing the clock between two marks is the device's work).
  {
    ProfileSpan step("step");
    fake.clock = 100;
    {
      ProfileSpan fwd("fwd_phase");
      {
        ProfileSpan gemm("gemm");
        fake.clock = 150;
      }
      fake.clock = 350;
    }
  }
  p.stop();
  EXPECT_EQ(fake.resolved, 0) << "nothing is resolved while recording (no wait per op)";
  EXPECT_EQ(fake.recorded, 7) << "two marks per event and the origin";
  const auto rows = p.rows();
  const auto* s = row(rows, "step");
  const auto* f = row(rows, "fwd_phase");
  const auto* g = row(rows, "gemm");
  ASSERT_TRUE(s && f && g);
  EXPECT_GT(fake.resolved, 0);
  EXPECT_EQ(s->device_calls, 1);
  EXPECT_EQ(s->device_total_ns, 350);
  EXPECT_EQ(f->device_total_ns, 250);
  EXPECT_EQ(g->device_total_ns, 50);
  EXPECT_EQ(g->device_self_ns, 50);
  EXPECT_EQ(f->device_self_ns, 200) << "fwd_phase's own time excludes gemm's";
  EXPECT_EQ(s->device_self_ns, 100) << "step's own time excludes fwd_phase's";
  EXPECT_EQ(p.device_profiled_ns(), 350) << "device self times sum to the covered device time";
  EXPECT_EQ(fake.released, 6) << "every event's marks go back once resolved";
  const std::string table = p.table();
  EXPECT_NE(table.find("device ms"), std::string::npos) << table;
  EXPECT_NE(table.find("device time (sum of device self times): 0.00035 ms"), std::string::npos) << table;
  // The trace: a GPU track with the three events at their device times.
  const std::string path = athanor::testing::fresh_temp_dir("profiler_device") + "/trace.json";
  p.write_chrome_trace(path);
  const auto j = nlohmann::json::parse(std::ifstream(path));
  int gpu_events = 0;
  bool named = false;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("tid", 0) != 1000) continue;
    if (e["ph"] == "M") named = e["args"]["name"] == "GPU cuda:0";
    else ++gpu_events;
    if (e.value("name", "") == "gemm") {
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.05);
    }
  }
  EXPECT_TRUE(named);
  EXPECT_EQ(gpu_events, 3);
  p.reset();
  EXPECT_EQ(fake.released, 7) << "and the origin at reset";
  p.set_device(Device::cpu());
}

TEST(ProfilerDevice, OnlyTheThreadThatSetTheDeviceRecordsMarks) {
  FakeTimingHooks fake;
  HooksScope scope(&fake);
  Profiler& p = Profiler::instance();
  p.reset();
  p.set_device(Device::cpu());  // this thread: no device
  p.start();
  std::thread other([&] {
    Profiler::instance().set_device(Device::cuda(0));
    ProfileSpan s("on_device");
  });
  other.join();
  { ProfileSpan s("host_only"); }
  p.stop();
  const auto rows = p.rows();
  ASSERT_TRUE(row(rows, "on_device") && row(rows, "host_only"));
  EXPECT_EQ(row(rows, "on_device")->device_calls, 1);
  EXPECT_EQ(row(rows, "host_only")->device_calls, 0);
  EXPECT_EQ(fake.recorded, 3);
  p.reset();
  EXPECT_EQ(fake.released, 3);
}

TEST(ProfilerDevice, WithoutDeviceTimingTheTableHasNoDeviceColumn) {
  Profiler& p = Profiler::instance();
  p.reset();
  p.set_device(Device::cpu());
  p.start();
  { ProfileSpan s("plain"); }
  p.stop();
  EXPECT_EQ(p.table().find("device ms"), std::string::npos);
  EXPECT_EQ(p.device_profiled_ns(), 0);
  p.reset();
}
