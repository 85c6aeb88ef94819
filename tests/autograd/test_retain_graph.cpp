// backward_retains_graph() (autograd/retain_graph.h): what a node's backward sees of its
// backward's retain_graph, so that it may consume its saved tensors only when the graph is
// freed after it (cross_entropy on cuda writes the logits' gradient over its saved logits).
#include <vector>

#include "athanor/autograd/engine.h"
#include "athanor/autograd/retain_graph.h"
#include "athanor/ops.h"
#include "test_util.h"

using namespace athanor;

namespace {
// y = x, whose backward notes backward_retains_graph() each time it runs.
Tensor spy(const Tensor& x, std::vector<bool>* seen) {
  return record("retain_spy", {x}, clone(x.detach()), [seen](const Node&, const Grads& g) {
    seen->push_back(backward_retains_graph());
    return Grads{g[0]};
  });
}
}  // namespace

TEST(RetainGraph, ANodeSeesItsBackwardsRetainGraphAndNothingOutsideOne) {
  EXPECT_FALSE(backward_retains_graph());
  Tensor x = from_vector(std::vector<double>{1.0, 2.0}, {2}).requires_grad_(true);
  std::vector<bool> seen;
  Tensor loss = sum(spy(x, &seen));
  backward({loss}, {}, /*retain_graph=*/true);
  EXPECT_FALSE(backward_retains_graph());  // restored after the backward
  backward({loss});
  EXPECT_EQ(seen, (std::vector<bool>{true, false}));
}

TEST(RetainGraph, TheSplitBackwardsWeightPassCarriesItsRetainGraph) {
  for (bool retain : {true, false}) {
    Tensor x = from_vector(std::vector<double>{1.0, 2.0}, {2}).requires_grad_(true);
    Tensor w = from_vector(std::vector<double>{3.0, 4.0}, {2}).requires_grad_(true);
    std::vector<bool> seen;
    // The spy consumes the weight directly: its backward is (or includes) the weight pass's work.
    Tensor loss = sum(mul(spy(w, &seen), x));
    DeferredWeightGrads pass = backward_input({loss}, {}, {w}, retain);
    EXPECT_FALSE(backward_retains_graph());
    seen.clear();
    pass.run();
    EXPECT_FALSE(backward_retains_graph());
    ASSERT_FALSE(seen.empty()) << "the spy did not run in the weight pass";
    for (bool s : seen) EXPECT_EQ(s, retain);
    EXPECT_TRUE(w.grad().defined());
  }
}
