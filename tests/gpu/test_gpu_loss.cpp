// cross_entropy's targets on CUDA are validated on the device, with no host sync in the call:
// an out-of-range class id is raised as an Error naming the value and its position at the next
// read from the device (the loss's item()), once; the bad row is left out of the loss (never
// read out of bounds); under anomaly mode the call itself raises.
#include <string>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/ops/loss.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

TEST(GpuLoss, OutOfRangeTargetIsRaisedAtTheNextReadNamingItsPosition) {
  ATH_REQUIRE_GPU();
  const Tensor logits = from_vector(random_vector(20, 3), {4, 5}, TensorOptions(DType::f32)).cuda();
  const Tensor bad = from_vector(std::vector<int64_t>{1, 0, 7, 4}, {4}).cuda();
  Tensor loss = cross_entropy(logits, bad);  // queued: no error yet
  try {
    (void)loss.item<double>();
    FAIL() << "no error for target 7 with C = 5";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("target value 7 at position 2"), std::string::npos) << m;
    EXPECT_NE(m.find("C = 5"), std::string::npos) << m;
  }
  // Reported once; the row was left out: the loss is the mean of the three good rows.
  const Tensor good = from_vector(std::vector<int64_t>{1, 0, -100, 4}, {4}).cuda();
  EXPECT_EQ(loss.item<double>(), cross_entropy(logits, good).item<double>());
  EXPECT_NO_THROW((void)cross_entropy(logits, good).item<double>());

  AnomalyModeGuard anomaly;
  EXPECT_THROW((void)cross_entropy(logits, bad), Error);
}
