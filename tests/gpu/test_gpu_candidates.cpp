// ATHANOR_CUDA_CANDIDATES (src/backend/cuda/candidates.h): the parsing and the scoped override.
// Host logic only: these run (and must pass) without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "athanor/core/error.h"
#include "backend/cuda/candidates.h"

namespace athanor {
namespace {

uint32_t bit(cuda::Candidate c) { return 1u << static_cast<unsigned>(c); }

TEST(GpuCandidates, ParsingOfTheVariable) {
  const uint32_t all = bit(cuda::Candidate::pointwise_vectorized) | bit(cuda::Candidate::lowp_copies) |
                       bit(cuda::Candidate::cross_entropy_vectorized) | bit(cuda::Candidate::norm_vectorized) |
                       bit(cuda::Candidate::attention_cudnn) | bit(cuda::Candidate::norm_accumulate_dx);
  EXPECT_EQ(cuda::parse_candidates(nullptr), 0u);
  EXPECT_EQ(cuda::parse_candidates(""), 0u);
  EXPECT_EQ(cuda::parse_candidates("none"), 0u);
  EXPECT_EQ(cuda::parse_candidates("all"), all);
  EXPECT_EQ(cuda::parse_candidates("lowp_copies"), bit(cuda::Candidate::lowp_copies));
  EXPECT_EQ(cuda::parse_candidates("lowp_copies,pointwise_vectorized,cross_entropy_vectorized,norm_vectorized,"
                                    "attention_cudnn,norm_accumulate_dx"),
            all);
  EXPECT_EQ(cuda::parse_candidates("cross_entropy_vectorized,lowp_copies"),
            bit(cuda::Candidate::cross_entropy_vectorized) | bit(cuda::Candidate::lowp_copies));
  for (const char* bad : {"ALL", "pointwise", "lowp_copies,", ",lowp_copies", "lowp_copies pointwise_vectorized", "1"}) {
    try {
      cuda::parse_candidates(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("ATHANOR_CUDA_CANDIDATES"), std::string::npos) << m;
      EXPECT_NE(m.find("pointwise_vectorized"), std::string::npos) << m;  // the known names are listed
    }
  }
}

TEST(GpuCandidates, OverrideIsScopedAndNested) {
  const bool before = cuda::candidate_enabled(cuda::Candidate::lowp_copies);
  {
    cuda::CandidateOverride on(cuda::Candidate::lowp_copies, true);
    EXPECT_TRUE(cuda::candidate_enabled(cuda::Candidate::lowp_copies));
    {
      cuda::CandidateOverride off(cuda::Candidate::lowp_copies, false);
      EXPECT_FALSE(cuda::candidate_enabled(cuda::Candidate::lowp_copies));
    }
    EXPECT_TRUE(cuda::candidate_enabled(cuda::Candidate::lowp_copies));
  }
  EXPECT_EQ(cuda::candidate_enabled(cuda::Candidate::lowp_copies), before);
}

}  // namespace
}  // namespace athanor
