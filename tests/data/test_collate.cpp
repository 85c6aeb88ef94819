// collate: stacking, sample ids, num_targets, and the errors for samples that do not stack.
#include "athanor/data/dataset.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::data;

namespace {
Sample sample(float base, std::vector<int64_t> target) {
  const auto n = static_cast<int64_t>(target.size());
  return {from_vector(std::vector<float>{base, base + 1, base + 2, base + 3, base + 4, base + 5}, {2, 3}),
          from_vector(target, {n})};
}
}  // namespace

TEST(Collate, StacksInputsTargetsAndIds) {
  Batch b = collate({sample(0, {1, 2}), sample(10, {3, -100}), sample(20, {-100, -100})}, {7, 3, 5});
  EXPECT_EQ(b.input.sizes(), (Shape{3, 2, 3}));
  EXPECT_EQ(b.target.sizes(), (Shape{3, 2}));
  EXPECT_EQ(b.target.dtype(), DType::i64);
  EXPECT_EQ(b.sample_ids, (std::vector<int64_t>{7, 3, 5}));
  const auto v = b.input.to_vector();
  for (int s = 0; s < 3; ++s)
    for (int k = 0; k < 6; ++k) EXPECT_EQ(v[s * 6 + k], 10.0 * s + k);
  EXPECT_EQ(b.target.to_vector(), (std::vector<double>{1, 2, 3, -100, -100, -100}));
  EXPECT_EQ(b.num_targets, 3);  // elements != ignore_index
  EXPECT_EQ(collate({sample(0, {1, 2})}, {0}, /*ignore_index=*/2).num_targets, 1);
}

TEST(Collate, ScalarLabelsCountOnePerSample) {
  std::vector<Sample> s;
  for (int i = 0; i < 4; ++i) s.push_back({full({1, 2, 2}, i), scalar_tensor(i, DType::i64)});
  Batch b = collate(s, {0, 1, 2, 3});
  EXPECT_EQ(b.input.sizes(), (Shape{4, 1, 2, 2}));
  EXPECT_EQ(b.target.sizes(), (Shape{4}));
  EXPECT_EQ(b.num_targets, 4);
}

TEST(Collate, NonContiguousSamples) {
  Tensor base = from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor t = make_view(base, {3, 2}, {1, 3}, 0);  // the transpose
  Batch b = collate({{t, scalar_tensor(0, DType::i64)}, {t, scalar_tensor(1, DType::i64)}}, {0, 1});
  EXPECT_EQ(b.input.sizes(), (Shape{2, 3, 2}));
  EXPECT_EQ(b.input.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5, 0, 3, 1, 4, 2, 5}));
}

TEST(Collate, MismatchedSamplesAreClearErrors) {
  auto msg = error_message([] { collate({sample(0, {1, 2}), sample(0, {1, 2, 3})}, {4, 9}); });
  EXPECT_NE(msg.find("target of sample 9 ([3] i64) with that of sample 4 ([2] i64)"), std::string::npos) << msg;
  msg = error_message([] {
    collate({{zeros({2}), scalar_tensor(0, DType::i64)}, {zeros({2}, DType::f64), scalar_tensor(0, DType::i64)}}, {0, 1});
  });
  EXPECT_NE(msg.find("input of sample 1 ([2] f64) with that of sample 0 ([2] f32)"), std::string::npos) << msg;
  msg = error_message([] { collate({}, {}); });
  EXPECT_NE(msg.find("no samples"), std::string::npos) << msg;
  msg = error_message([] { collate({sample(0, {1})}, {0, 1}); });
  EXPECT_NE(msg.find("1 samples but 2 sample ids"), std::string::npos) << msg;
}

}  // namespace athanor
