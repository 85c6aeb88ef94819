#pragma once
// The instruction-set level athanor's own CPU kernels run at, chosen once per process.
//
// The default build is portable: everything is compiled for x86-64-v3 (AVX2 + FMA,
// Haswell / Zen 1 and later), and the hand-written kernels (isa_kernel.h) are compiled a
// second and a third time, for AVX-512 (x86-64-v4) and for AVX-512 with AVX512_BF16. The
// first kernel call picks the highest level this CPU runs, from CPUID (the way oneDNN
// picks its own kernels, which it goes on doing, AMX included), capped by the
// environment variable ATHANOR_ISA=avx2|avx512|avx512_bf16 (like ONEDNN_MAX_CPU_ISA).
// Asking for a level the CPU does not have, or an unknown name, is an error.
#include <string>
#include <vector>

namespace athanor::cpu {

// Ordered: each level includes the ones below it.
enum class Isa : int { avx2 = 1, avx512 = 2, avx512_bf16 = 3 };

const char* isa_name(Isa level);  // "avx2", "avx512", "avx512_bf16"
// What each level needs from the CPU, in words (for messages and --version).
const char* isa_description(Isa level);

// The highest level this CPU (and its OS, which must save the AVX-512 state) can run.
Isa isa_supported();
// Every level up to isa_supported(), lowest first.
std::vector<Isa> isa_supported_levels();

// The level the kernels run at: isa_supported(), capped by ATHANOR_ISA. An invalid
// ATHANOR_ISA makes this throw athanor::Error, except inside an OpenMP parallel region
// (where nothing may throw: the level is the CPU's until a call outside one throws).
Isa active_isa();
// Throws athanor::Error when ATHANOR_ISA is invalid or asks for more than the CPU has.
// Programs call it at start-up so the message comes before any work (the CLI does).
void check_isa_request();

// Runs the kernels at another level the CPU supports (tests run each level in one
// process); throws athanor::Error for a level above isa_supported(). Not for use while
// kernels run on other threads.
void set_active_isa(Isa level);

// Sets a level for the lifetime of the object, then restores the previous one (tests).
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa level);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  Isa previous_;
};

// The CPU's brand string (CPUID), e.g. "AMD EPYC 9R45 96-Core Processor".
std::string cpu_model_name();
// oneDNN's own choice (dnnl_get_effective_cpu_isa), e.g. "avx512_core_amx".
std::string onednn_isa_name();
// One line for logs and --version: model, the kernels' level, what the CPU supports, oneDNN's ISA.
std::string isa_summary();

}  // namespace athanor::cpu
