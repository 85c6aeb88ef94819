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

// The derivation against hand computations (cores x FMA units x lanes x 2 flops x GHz, each
// figure written out from the vendors' documentation, not from the code's tables).
TEST(CpuPeak, DerivationMatchesHandComputationsPerIsaLevel) {
  cpu::PeakInputs spr;  // an Intel Sapphire Rapids Xeon (family 6, model 0x8f), 2 cores at 3.55 GHz
  spr.vendor = "GenuineIntel", spr.family = 6, spr.model = 0x8f, spr.ghz = 3.55, spr.threads = 2;
  struct Case {
    const char* what;
    cpu::Isa isa;
    bool amx;
    DType dt;
    double gflops;
  };
  const Case cases[] = {
      // AVX2: 2 x 256-bit FMA units = 2 x 8 f32 lanes.
      {"avx2 f32", cpu::Isa::avx2, false, DType::f32, 2 * 2 * 8 * 2 * 3.55},          // 227.2
      {"avx2 f64", cpu::Isa::avx2, false, DType::f64, 2 * 2 * 4 * 2 * 3.55},          // 113.6
      {"avx2 bf16 (f32 units)", cpu::Isa::avx2, false, DType::bf16, 227.2},
      // AVX-512: 2 x 512-bit FMA units = 2 x 16 f32 lanes; DESIGN.md's 454 GFLOP/s.
      {"avx512 f32", cpu::Isa::avx512, false, DType::f32, 454.4},
      {"avx512 f64", cpu::Isa::avx512, false, DType::f64, 227.2},
      {"avx512 bf16 (f32 units)", cpu::Isa::avx512, false, DType::bf16, 454.4},
      // AVX512_BF16: vdpbf16ps does 32 bf16 products per 512-bit unit; DESIGN.md's 909.
      {"avx512_bf16 f32", cpu::Isa::avx512_bf16, false, DType::f32, 454.4},
      {"avx512_bf16 bf16", cpu::Isa::avx512_bf16, false, DType::bf16, 908.8},
      // AMX: TDPBF16PS, 16 x 16 x 32 multiply-adds in 16 cycles = 1024 flops per cycle per core.
      {"amx bf16", cpu::Isa::avx512_bf16, true, DType::bf16, 2 * 1024 * 3.55},  // 7270.4
      {"amx f32 (FMA units)", cpu::Isa::avx512_bf16, true, DType::f32, 454.4},
  };
  for (const Case& c : cases) {
    cpu::PeakInputs in = spr;
    in.isa = c.isa;
    in.amx_bf16 = c.amx;
    EXPECT_NEAR(cpu::derive_peak(c.dt, in).gflops, c.gflops, 1e-9) << c.what;
  }
  // AMD: Zen 4 runs AVX-512 on 2 x 256-bit units (16 cores at 3.7 GHz: 16 x 2 x 8 x 2 x 3.7);
  // Zen 5 has 2 x 512-bit units; Zen 1 splits 256-bit FMAs over 2 x 128-bit units.
  cpu::PeakInputs zen4{"AuthenticAMD", 0x19, 0x11, cpu::Isa::avx512_bf16, false, 3.7, 16};
  EXPECT_NEAR(cpu::derive_peak(DType::f32, zen4).gflops, 1894.4, 1e-9);
  EXPECT_NEAR(cpu::derive_peak(DType::bf16, zen4).gflops, 3788.8, 1e-9);  // vdpbf16ps: twice f32
  cpu::PeakInputs zen5{"AuthenticAMD", 0x1a, 0x02, cpu::Isa::avx512, false, 2.5, 4};
  EXPECT_NEAR(cpu::derive_peak(DType::f32, zen5).gflops, 4 * 2 * 16 * 2 * 2.5, 1e-9);  // 640
  cpu::PeakInputs zen1{"AuthenticAMD", 0x17, 0x01, cpu::Isa::avx2, false, 3.0, 8};
  EXPECT_NEAR(cpu::derive_peak(DType::f32, zen1).gflops, 384.0, 1e-9);
}

// On this machine, at two ISA levels the CPU runs: the peak in use follows the level (the
// kernels' ISA is chosen at run time), with the same cores and clock.
TEST(CpuPeak, FollowsTheIsaLevelInUse) {
  const double ghz = cpu::measured_clock_ghz();
  const cpu::PeakInputs here = cpu::this_cpu(2);
  std::vector<cpu::Isa> levels = cpu::isa_supported_levels();
  for (cpu::Isa level : levels) {
    cpu::ScopedIsa scoped(level);
    const cpu::CpuPeak p = cpu::cpu_peak(DType::f32, 2);
    EXPECT_EQ(cpu::this_cpu(2).isa, level);
    if (here.vendor == "GenuineIntel") {  // every Intel core with AVX2 has 2 FMA units: 8 lanes each, 16 with AVX-512
      const double lanes = level == cpu::Isa::avx2 ? 8 : 16;
      EXPECT_NEAR(p.gflops, 2 * 2 * lanes * 2 * ghz, 1e-9) << cpu::isa_name(level);
    }
    cpu::PeakInputs in = here;
    in.isa = level;
    EXPECT_DOUBLE_EQ(p.gflops, cpu::derive_peak(DType::f32, in).gflops) << cpu::isa_name(level);
  }
  if (levels.size() < 2) testing::note_isa("only one ISA level on this CPU: the level switch is not exercised");
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
