// Anomaly mode's record of the first non-finite op (autograd/anomaly.h): the op,
// the module it ran in, the phase, the inputs' shapes and values — the origin of
// a NaN cascade, not the ops downstream of it.
#include <cmath>
#include <limits>

#include "athanor/autograd/anomaly.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
Tensor vec(std::vector<double> v) { return from_vector(v, {static_cast<int64_t>(v.size())}, TensorOptions(DType::f64)); }
}  // namespace

TEST(AnomalyReport, ForwardNamesTheFirstOpItsModuleAndInputs) {
  clear_anomaly();
  Tensor x = vec({1.0, 0.0, 2.0}).requires_grad_(true);
  bool threw = false;
  try {
    AnomalyModeGuard on;
    ModuleScope model("model");
    Tensor h = mul(x, 2.0);  // finite
    Tensor y;
    {
      ModuleScope block("blocks.3");
      y = log(h);  // log(0) = -inf: the origin
    }
    Tensor z = mul(y, 0.0);  // -inf * 0 = NaN downstream; must not replace the origin
    (void)z;
  } catch (const Error&) {
    threw = true;
  }
  ASSERT_TRUE(threw);
  auto a = last_anomaly();
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->phase, "forward");
  EXPECT_EQ(a->op, "log");
  EXPECT_EQ(a->module_path, "model.blocks.3");
  EXPECT_EQ(a->output_index, 0u);
  ASSERT_EQ(a->inputs.size(), 1u);
  ASSERT_EQ(a->input_shapes.size(), 1u);
  EXPECT_EQ(a->input_shapes[0], "[3] f64");
  // The saved input is the op's actual input (2x), a copy detached from the graph.
  EXPECT_EQ(a->inputs[0].to_vector(), (std::vector<double>{2.0, 0.0, 4.0}));
  EXPECT_FALSE(a->inputs[0].requires_grad());
  const std::vector<double> out = a->output.to_vector();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(std::isinf(out[1]) && out[1] < 0);
  EXPECT_NE(a->output_stats.find("inf 1"), std::string::npos) << a->output_stats;
  EXPECT_NE(a->message.find("log"), std::string::npos) << a->message;
}

TEST(AnomalyReport, KeepsOnlyTheFirstUntilCleared) {
  clear_anomaly();
  AnomalyModeGuard on;
  EXPECT_THROW(log(vec({0.0})), Error);
  EXPECT_THROW(sqrt(vec({-1.0})), Error);  // NaN, a second anomaly
  ASSERT_TRUE(last_anomaly().has_value());
  EXPECT_EQ(last_anomaly()->op, "log");
  clear_anomaly();
  EXPECT_FALSE(last_anomaly().has_value());
  EXPECT_THROW(sqrt(vec({-1.0})), Error);
  ASSERT_TRUE(last_anomaly().has_value());
  EXPECT_EQ(last_anomaly()->op, "sqrt");
  clear_anomaly();
}

TEST(AnomalyReport, BackwardNamesTheNodeAndTheIncomingGradient) {
  clear_anomaly();
  // sqrt(0) = 0 is finite, but its derivative 1/(2 sqrt(0)) is inf: the
  // anomaly appears only in backward, in the sqrt node of module "enc".
  Tensor x = vec({4.0, 0.0}).requires_grad_(true);
  bool threw = false;
  try {
    AnomalyModeGuard on;
    Tensor y;
    {
      ModuleScope enc("enc");
      y = sqrt(x);
    }
    sum(mul(y, 3.0)).backward();
  } catch (const Error&) {
    threw = true;
  }
  ASSERT_TRUE(threw);
  auto a = last_anomaly();
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->phase, "backward");
  EXPECT_NE(a->op.find("sqrt"), std::string::npos) << a->op;
  EXPECT_EQ(a->module_path, "enc");
  ASSERT_EQ(a->inputs.size(), 1u);  // the gradient flowing into sqrt's node: d(3*sum)/dy = 3
  EXPECT_EQ(a->inputs[0].to_vector(), (std::vector<double>{3.0, 3.0}));
  EXPECT_EQ(a->input_shapes[0], "[2] f64");
  const std::vector<double> g = a->output.to_vector();
  ASSERT_EQ(g.size(), 2u);
  EXPECT_DOUBLE_EQ(g[0], 3.0 / (2.0 * 2.0));  // 3 * 1/(2 sqrt(4)), computed by hand
  EXPECT_TRUE(std::isinf(g[1]));
  clear_anomaly();
}

TEST(AnomalyReport, NothingRecordedWhenAnomalyModeIsOff) {
  clear_anomaly();
  Tensor y = log(vec({0.0}));
  EXPECT_TRUE(std::isinf(y.item()));
  EXPECT_FALSE(last_anomaly().has_value());
}

}  // namespace athanor
