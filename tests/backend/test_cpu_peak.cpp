// The theoretical peak behind MFU (backend/cpu/cpu_peak.h): the formula, the measured
// clock, what each precision computes on, and an independent check that a real GEMM never
// runs faster than the peak it is measured against (a clock measured too low, or too few
// FMA units assumed, would make MFU exceed what the hardware can do).
#include <omp.h>

#include <chrono>
#include <vector>

#include "backend/cpu/cpu_peak.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "test_util.h"

namespace athanor {
namespace {

TEST(CpuPeak, IsCoresTimesUnitsTimesLanesTimesTwoTimesClock) {
  const double ghz = cpu::measured_clock_ghz();
  EXPECT_GT(ghz, 0.5);  // no x86-64 server runs its cores below 500 MHz or above 7 GHz
  EXPECT_LT(ghz, 7.0);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const cpu::CpuPeak one = cpu::cpu_peak(dt, 1), two = cpu::cpu_peak(dt, 2);
    EXPECT_DOUBLE_EQ(one.gflops, one.units * one.lanes * 2.0 * one.ghz) << dtype_name(dt);
    EXPECT_DOUBLE_EQ(two.gflops, 2 * one.gflops) << dtype_name(dt);
    EXPECT_NE(one.describe().find("GFLOP/s"), std::string::npos);
  }
  const cpu::CpuPeak f32 = cpu::cpu_peak(DType::f32, 1), f64 = cpu::cpu_peak(DType::f64, 1);
  EXPECT_DOUBLE_EQ(f64.gflops, f32.gflops / 2);
  // f32 lanes: 16 per AVX-512 unit (8 on Zen 4's 256-bit units), 8 per AVX2 unit.
  if (cpu::active_isa() == cpu::Isa::avx2) EXPECT_LE(f32.lanes, 8);
  else EXPECT_GE(f32.lanes, 8);
}

TEST(CpuPeak, Bf16IsComputedOnWhatTheHardwareHas) {
  const cpu::CpuPeak f32 = cpu::cpu_peak(DType::f32, 1), bf16 = cpu::cpu_peak(DType::bf16, 1);
  testing::note_isa("bf16 on " + bf16.engine);
  if (cpu::onednn_isa_name() == "avx512_core_amx") {
    EXPECT_EQ(bf16.engine, "AMX-BF16 tiles");
    EXPECT_DOUBLE_EQ(bf16.gflops, 1024 * bf16.ghz);  // 1024 flops per cycle per core
  } else if (cpu::active_isa() == cpu::Isa::avx512_bf16) {
    EXPECT_DOUBLE_EQ(bf16.gflops, 2 * f32.gflops);  // vdpbf16ps: two products per f32 lane
  } else {
    EXPECT_DOUBLE_EQ(bf16.gflops, f32.gflops);  // no bf16 arithmetic: the f32 units
  }
}

// A large f32 GEMM on oneDNN, on one thread, against the one-core f32 peak: it must not
// exceed it (5% for timer and clock noise). Also not absurdly below it: oneDNN's kernels
// reach 60-95% of peak on an idle core; 5% leaves room for a loaded machine.
TEST(CpuPeak, AGemmStaysBelowThePeak) {
  testing::ThreadCount one(1);
  const int64_t n = 512;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  auto run = [&] { cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); };
  run();
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double gflops = 2.0 * n * n * n / best * 1e-9;
  const cpu::CpuPeak peak = cpu::cpu_peak(DType::f32, 1);
  testing::note_isa("f32 GEMM " + std::to_string(gflops) + " GFLOP/s; peak " + peak.describe());
  EXPECT_LE(gflops, 1.05 * peak.gflops) << peak.describe();
  EXPECT_GE(gflops, 0.05 * peak.gflops) << peak.describe();
}

}  // namespace
}  // namespace athanor
