// The op table is complete: every op has a name, a reference kernel, a fast
// kernel, a backward and a category, and every public op the tests exercise is
// listed (so the mixed-precision work can look each one up).
#include <set>

#include "test_util.h"

namespace athanor {

TEST(OpTable, EveryEntryHasAllFourFacts) {
  std::set<std::string> names;
  for (const OpInfo& op : op_table()) {
    EXPECT_TRUE(names.insert(op.name).second) << "duplicate op " << op.name;
    EXPECT_FALSE(op.reference.empty()) << op.name;
    EXPECT_FALSE(op.fast.empty()) << op.name;
    EXPECT_FALSE(op.backward.empty()) << op.name;
  }
}

TEST(OpTable, ListsEveryDifferentiableOp) {
  for (const char* name : {"add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "rsqrt", "abs", "clamp", "where",
                           "masked_fill", "tanh", "sigmoid", "relu", "gelu", "silu", "sum", "mean", "max", "min", "var",
                           "view", "permute", "expand", "slice", "cat", "split", "index_select", "gather", "matmul", "linear",
                           "embedding", "layer_norm", "rms_norm", "batch_norm", "softmax", "log_softmax", "cross_entropy",
                           "mse_loss", "dropout", "scaled_dot_product_attention", "causal_self_attention", "conv2d", "max_pool2d",
                           "avg_pool2d", "gelu_linear", "linear_relu"})
    EXPECT_NE(find_op(name), nullptr) << name << " is missing from the op table";
}

TEST(OpTable, AutocastCategoriesFollowTheMixedPrecisionPolicy) {
  for (const char* n : {"matmul", "linear", "conv2d", "scaled_dot_product_attention", "causal_self_attention", "gelu_linear", "linear_relu"})
    EXPECT_EQ(find_op(n)->autocast, AutocastCategory::lower_precision) << n;
  for (const char* n : {"softmax", "log_softmax", "layer_norm", "rms_norm", "batch_norm", "cross_entropy", "sum", "mean", "var", "exp", "log"})
    EXPECT_EQ(find_op(n)->autocast, AutocastCategory::f32) << n;
  for (const char* n : {"add", "sub", "mul", "div"}) EXPECT_EQ(find_op(n)->autocast, AutocastCategory::promote) << n;
  EXPECT_EQ(find_op("no_such_op"), nullptr);
}

}  // namespace athanor
