#include "backend/cpu/isa.h"

#include <cpuid.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "athanor/core/error.h"

namespace athanor::cpu {

namespace {

constexpr Isa kLevels[] = {Isa::avx2, Isa::avx512, Isa::avx512_bf16};

// __builtin_cpu_supports checks CPUID and that the OS saves the YMM/ZMM state (XGETBV).
Isa detect() {
  __builtin_cpu_init();
  const bool v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  if (v4 && __builtin_cpu_supports("avx512bf16")) return Isa::avx512_bf16;
  if (v4) return Isa::avx512;
  return Isa::avx2;  // the build's baseline: a CPU without it cannot run this binary (see ensure_baseline)
}

struct Resolved {
  Isa supported = Isa::avx2;
  Isa level = Isa::avx2;
  std::string error;  // set when ATHANOR_ISA is invalid or asks for too much
};

Resolved resolve() {
  Resolved r;
  r.supported = r.level = detect();
  const char* env = std::getenv("ATHANOR_ISA");
  if (!env || !*env) return r;
  const std::string want(env);
  const Isa* found = std::find_if(std::begin(kLevels), std::end(kLevels),
                                  [&](Isa l) { return want == isa_name(l); });
  if (found == std::end(kLevels)) {
    r.error = "ATHANOR_ISA=" + want + " is not a level; expected avx2, avx512 or avx512_bf16";
  } else if (static_cast<int>(*found) > static_cast<int>(r.supported)) {
    r.error = "ATHANOR_ISA=" + want + " asks for " + isa_description(*found) + ", but this CPU (" + cpu_model_name() +
              ") runs at most " + isa_name(r.supported) + " (" + isa_description(r.supported) + ")";
  } else {
    r.level = *found;
  }
  return r;
}

const Resolved& resolved() {
  static const Resolved r = resolve();
  return r;
}

// 0: no override; else the Isa set by set_active_isa.
std::atomic<int> g_override{0};

[[noreturn]] void throw_request_error(const Resolved& r) {
  ATH_FAIL("cpu isa", r.error,
           Hint{std::string("unset ATHANOR_ISA, or set it to ") + isa_name(r.supported) + " or a lower level"});
}

}  // namespace

const char* isa_name(Isa level) {
  switch (level) {
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512_bf16: return "avx512_bf16";
  }
  return "?";
}

const char* isa_description(Isa level) {
  switch (level) {
    case Isa::avx2: return "x86-64-v3: AVX2, FMA, F16C, BMI2";
    case Isa::avx512: return "x86-64-v4: AVX-512 F, BW, CD, DQ, VL";
    case Isa::avx512_bf16: return "x86-64-v4 with AVX512_BF16";
  }
  return "?";
}

Isa isa_supported() { return resolved().supported; }

std::vector<Isa> isa_supported_levels() {
  std::vector<Isa> out;
  for (Isa l : kLevels)
    if (static_cast<int>(l) <= static_cast<int>(isa_supported())) out.push_back(l);
  return out;
}

Isa active_isa() {
  if (const int o = g_override.load(std::memory_order_relaxed)) return static_cast<Isa>(o);
  const Resolved& r = resolved();
  if (!r.error.empty() && !omp_in_parallel()) throw_request_error(r);
  return r.level;
}

void check_isa_request() {
  const Resolved& r = resolved();
  if (!r.error.empty()) throw_request_error(r);
}

void set_active_isa(Isa level) {
  ATH_CHECK(static_cast<int>(level) <= static_cast<int>(isa_supported()), "cpu isa",
            "cannot run the kernels at ", isa_name(level), " (", isa_description(level), "): this CPU (",
            cpu_model_name(), ") runs at most ", isa_name(isa_supported()));
  g_override.store(static_cast<int>(level), std::memory_order_relaxed);
}

ScopedIsa::ScopedIsa(Isa level) : previous_(active_isa()) { set_active_isa(level); }
ScopedIsa::~ScopedIsa() { g_override.store(static_cast<int>(previous_), std::memory_order_relaxed); }

std::string cpu_model_name() {
  unsigned int regs[12] = {};
  unsigned int max_ext = __get_cpuid_max(0x80000000u, nullptr);
  if (max_ext < 0x80000004u) return "unknown x86-64 CPU";
  for (unsigned int i = 0; i < 3; ++i)
    __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
  char brand[49] = {};
  std::memcpy(brand, regs, 48);
  std::string s(brand);
  const auto first = s.find_first_not_of(' '), last = s.find_last_not_of(' ');
  return first == std::string::npos ? "unknown x86-64 CPU" : s.substr(first, last - first + 1);
}

std::string onednn_isa_name() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "all";
  }
}

std::string isa_summary() {
  const Resolved& r = resolved();
  const Isa level = r.error.empty() ? active_isa() : r.supported;
  std::string s = cpu_model_name() + "; kernels " + isa_name(level);
  if (level != r.supported) s += std::string(" (capped by ATHANOR_ISA; the CPU runs ") + isa_name(r.supported) + ")";
  return s + "; oneDNN " + onednn_isa_name();
}

}  // namespace athanor::cpu
