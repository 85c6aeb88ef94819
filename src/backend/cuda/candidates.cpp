// ATHANOR_CUDA_CANDIDATES (candidates.h). Plain C++, so that it is tested without a GPU.
#include "backend/cuda/candidates.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "athanor/core/error.h"

namespace athanor::cuda {

const char* candidate_name(Candidate c) {
  switch (c) {
    case Candidate::pointwise_vectorized: return "pointwise_vectorized";
    case Candidate::lowp_copies: return "lowp_copies";
    case Candidate::cross_entropy_vectorized: return "cross_entropy_vectorized";
    case Candidate::norm_vectorized: return "norm_vectorized";
    case Candidate::attention_cudnn: return "attention_cudnn";
    case Candidate::norm_accumulate_dx: return "norm_accumulate_dx";
    case Candidate::count: break;
  }
  return "?";
}

namespace {
constexpr uint32_t kAll = (1u << static_cast<unsigned>(Candidate::count)) - 1u;

std::string known_names() {
  std::string s;
  for (unsigned i = 0; i < static_cast<unsigned>(Candidate::count); ++i)
    s += std::string(i ? ", " : "") + candidate_name(static_cast<Candidate>(i));
  return s;
}

uint32_t bit_of(const std::string& name) {
  for (unsigned i = 0; i < static_cast<unsigned>(Candidate::count); ++i)
    if (name == candidate_name(static_cast<Candidate>(i))) return 1u << i;
  ATH_FAIL("ATHANOR_CUDA_CANDIDATES", "unknown candidate '", name, "'",
           Hint{"give 'all', 'none' or a comma-separated list of: " + known_names()});
}

// Bit 31: not read yet (the environment is read on first use).
constexpr uint32_t kUnread = 1u << 31;
std::atomic<uint32_t> g_enabled{kUnread};

uint32_t enabled_mask() {
  uint32_t v = g_enabled.load(std::memory_order_acquire);
  if (v & kUnread) {
    const uint32_t parsed = parse_candidates(std::getenv("ATHANOR_CUDA_CANDIDATES"));
    uint32_t expected = kUnread;
    v = g_enabled.compare_exchange_strong(expected, parsed, std::memory_order_acq_rel) ? parsed : expected;
  }
  return v;
}
}  // namespace

uint32_t parse_candidates(const char* value) {
  const std::string s = value == nullptr ? "" : value;
  if (s.empty() || s == "none") return 0;
  if (s == "all") return kAll;
  uint32_t mask = 0;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = s.find(',', start);
    const std::string name = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    mask |= bit_of(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return mask;
}

bool candidate_enabled(Candidate c) { return (enabled_mask() >> static_cast<unsigned>(c)) & 1u; }

CandidateOverride::CandidateOverride(Candidate c, bool enabled) : prev_(enabled_mask()) {
  const uint32_t bit = 1u << static_cast<unsigned>(c);
  g_enabled.store(enabled ? (prev_ | bit) : (prev_ & ~bit), std::memory_order_release);
}

CandidateOverride::~CandidateOverride() { g_enabled.store(prev_, std::memory_order_release); }

}  // namespace athanor::cuda
