#include "backend/cpu/cpu_peak.h"

#include <cpuid.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/cpu/isa.h"

namespace athanor::cpu {

namespace {

struct CpuIdentity {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD"
  unsigned family = 0, model = 0;
};

CpuIdentity identify() {
  CpuIdentity id;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return id;
  char v[13] = {};
  std::memcpy(v, &b, 4), std::memcpy(v + 4, &d, 4), std::memcpy(v + 8, &c, 4);
  id.vendor = v;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return id;
  const unsigned base_family = (a >> 8) & 0xf, ext_family = (a >> 20) & 0xff;
  const unsigned base_model = (a >> 4) & 0xf, ext_model = (a >> 16) & 0xf;
  id.family = base_family == 0xf ? base_family + ext_family : base_family;
  id.model = (base_family == 0x6 || base_family == 0xf) ? (ext_model << 4) + base_model : base_model;
  return id;
}

// AMX-BF16 (CPUID.(EAX=7,ECX=0):EDX[22]) with the OS's permission to use the tiles: oneDNN
// asks the kernel for it (arch_prctl) before its first AMX kernel, and its effective ISA
// says whether it got it.
bool amx_bf16_in_use() { return onednn_isa_name() == "avx512_core_amx"; }

// FMA units per core and their width in f32 lanes, from the vendor and family (not in CPUID).
void fma_units(const CpuIdentity& id, bool avx512, int& units, int& lanes) {
  units = 2;
  lanes = avx512 ? 16 : 8;
  if (id.vendor == "AuthenticAMD") {
    if (id.family == 0x19 && avx512) lanes = 8;   // Zen 4: AVX-512 on 256-bit units
    if (id.family == 0x17 && id.model < 0x30) lanes = 4;  // Zen 1 / Zen+: 256-bit ops split in two
  }
}

double nominal_ghz() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return std::stod(line.substr(colon + 1)) / 1000.0;
    }
  return 0;
}

// Seconds for `trips` x 100 dependent 64-bit multiplies. IMUL r64, r64 has a latency of 3
// cycles on every x86-64 core of the last decade (Intel since Nehalem, AMD Zen 1-5), and a
// chain of them cannot be shortened: adds can (Golden Cove folds add-immediates at rename,
// several per cycle).
double time_mul_chain(long trips) {
  uint64_t x = 1, one = 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < trips; ++i) {
    asm volatile(
        ".rept 100\n\t"
        "imul %1, %0\n\t"
        ".endr"
        : "+r"(x)
        : "r"(one));
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}
constexpr double kMulLatency = 3;

}  // namespace

double measured_clock_ghz() {
  static const double ghz = [] {
    // Many short windows (2.5e5 multiplies, ~0.2 ms at 3.5 GHz), the fastest one counted: on a
    // loaded machine some windows are cut by preemption, the fastest is not.
    constexpr long kTrips = 2500;
    time_mul_chain(20 * kTrips);  // wake the core to its working clock
    double best = 0;
    for (int r = 0; r < 200; ++r) best = std::max(best, kMulLatency * 100.0 * kTrips / time_mul_chain(kTrips) * 1e-9);
    return best;
  }();
  return ghz;
}

CpuPeak derive_peak(DType dt, const PeakInputs& in) {
  CpuPeak p;
  p.threads = std::max(in.threads, 1);
  p.ghz = in.ghz;
  const bool avx512 = in.isa != Isa::avx2;
  fma_units({in.vendor, in.family, in.model}, avx512, p.units, p.lanes);
  p.engine = avx512 ? "AVX-512 FMA" : "AVX2 FMA";
  if (dt == DType::f64) p.lanes /= 2;
  if (dt == DType::bf16) {
    if (in.amx_bf16) {  // a TDPBF16PS: 16 x 16 x 32 multiply-adds per 16 cycles, one tile unit
      p.units = 1;
      p.lanes = 512;
      p.engine = "AMX-BF16 tiles";
    } else if (in.isa == Isa::avx512_bf16) {  // vdpbf16ps: two multiply-adds per f32 lane
      p.lanes *= 2;
      p.engine = "AVX512_BF16 dot products";
    }
  }
  p.gflops = p.threads * p.units * p.lanes * 2.0 * p.ghz;
  return p;
}

PeakInputs this_cpu(int threads) {
  const CpuIdentity id = identify();
  PeakInputs in;
  in.vendor = id.vendor;
  in.family = id.family;
  in.model = id.model;
  // The level in use (isa.h): the CPU's own, unless ATHANOR_ISA caps it to stand in for a
  // smaller CPU, whose peak this then is (with oneDNN capped alike, ONEDNN_MAX_CPU_ISA).
  in.isa = active_isa();
  in.amx_bf16 = amx_bf16_in_use();
  in.ghz = measured_clock_ghz();
  in.threads = threads;
  return in;
}

CpuPeak cpu_peak(DType dt, int threads) {
  CpuPeak p = derive_peak(dt, this_cpu(threads));
  p.nominal_ghz = nominal_ghz();
  return p;
}

std::string CpuPeak::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%d core%s x %d %s unit%s x %d lanes x 2 flops x %.2f GHz (measured; nominal %.2f) = %.0f GFLOP/s",
                threads, threads == 1 ? "" : "s", units, engine.c_str(), units == 1 ? "" : "s", lanes, ghz, nominal_ghz,
                gflops);
  return buf;
}

}  // namespace athanor::cpu
