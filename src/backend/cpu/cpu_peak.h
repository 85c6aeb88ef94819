#pragma once
// The theoretical peak of this CPU for a precision, the MFU denominator (PaLM's
// definition: model FLOPs per second over the hardware's peak, never over a measured
// GEMM rate):
//
//   peak = cores in use x vector FMA units per core x lanes per unit x 2 flops x clock
//
// for f32 on the FMA units (AVX-512 or AVX2), and for bf16 on whatever the hardware
// multiplies bf16 with: AMX tiles (1024 flops per cycle per core on Sapphire Rapids and
// later), AVX512_BF16's vdpbf16ps (two products per f32 lane: twice the f32 rate), or
// nothing (bf16 then runs on the f32 units, at their peak).
//
// FMA units per core are not in CPUID; they come from the vendor and family: 2 x 512-bit
// on Intel's AVX-512 Xeons and on AMD Zen 5; 2 x 256-bit on Zen 4 (AVX-512 executed on
// 256-bit units), Zen 2/3 and Intel AVX2 cores; 2 x 128-bit on Zen 1. The clock is
// measured once, by timing a chain of dependent multiplies (3 cycles each) on one core:
// the rate the core really runs at, turbo included, which in a VM is what the guest gets.
// The nominal clock (/proc/cpuinfo) is reported beside it.
#include <string>

#include "athanor/core/dtype.h"
#include "backend/cpu/isa.h"

namespace athanor::cpu {

struct CpuPeak {
  double gflops = 0;       // the peak for `threads` cores
  int threads = 0;
  int units = 0;           // FMA units (or AMX tile units) per core
  int lanes = 0;           // multiply-adds per unit per cycle
  double ghz = 0;          // measured clock
  double nominal_ghz = 0;  // /proc/cpuinfo's "cpu MHz" (0 when absent)
  std::string engine;      // "AVX-512 FMA", "AVX2 FMA", "AVX512_BF16 dot products", "AMX-BF16 tiles"
  // "2 cores x 2 AVX-512 FMA units x 16 lanes x 2 flops x 3.55 GHz (measured; nominal 2.10) = 454 GFLOP/s"
  std::string describe() const;
};

// What the peak follows from. cpu_peak() reads them from this machine; tests give them by hand.
struct PeakInputs {
  std::string vendor;         // CPUID's: "GenuineIntel", "AuthenticAMD"
  unsigned family = 0;        // CPUID's display family and model
  unsigned model = 0;
  Isa isa = Isa::avx2;        // the level the kernels run at (active_isa())
  bool amx_bf16 = false;      // oneDNN computes bf16 GEMMs on AMX tiles
  double ghz = 0;             // the clock
  int threads = 1;            // cores in use
};

// The formula above, for `dt` on the machine `in` describes (nominal_ghz left 0).
CpuPeak derive_peak(DType dt, const PeakInputs& in);

// This machine's inputs now: CPUID, the kernels' ISA level, oneDNN's ISA, the measured clock.
PeakInputs this_cpu(int threads);

// The peak of `threads` cores for computing in `dt` (f32 and f64 on the FMA units, f64 at
// half the f32 lanes; bf16 as above; f16 as f32: athanor computes f16 GEMMs in f32), at the
// ISA level in use (isa.h) and oneDNN's (for AMX).
CpuPeak cpu_peak(DType dt, int threads);

// The measured clock of one core in GHz (cached after the first call, ~30 ms).
double measured_clock_ghz();

}  // namespace athanor::cpu
