#pragma once
// Shared test machinery:
//  - gradcheck: autograd gradients vs central finite differences in f64 (inputs on the CPU or
//    on a device: the op harness's f64 gradchecks run on the GPU too);
//  - make_noncontiguous: the same values in a strided (non-contiguous) layout;
//  - expect_close: elementwise |a - b| <= atol + rtol * |b| with a report of the worst element;
//  - ThreadCount: the OpenMP thread count for a scope;
//  - note_isa: names the instruction-set level a hardware-dependent test ran at.
#include <gtest/gtest.h>
#include <omp.h>

#include <functional>
#include <string>
#include <vector>

#include "athanor/ops.h"

namespace athanor::testing {

// Sets the OpenMP thread count for a scope (results that must not depend on it).
struct ThreadCount {
  int prev;
  explicit ThreadCount(int n) : prev(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(prev); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;
};

// A test whose property depends on the hardware (AVX512_BF16, oneDNN's kernels) names the
// level it ran at: the kernels' level (cpu::active_isa), oneDNN's ISA and `what`, printed as
// an "[ isa ]" line and recorded as the test's "isa" property (ctest's log, gtest's XML).
void note_isa(const std::string& what = "");
// Runs body(level) at each instruction-set level this CPU supports (cpu::ScopedIsa), lowest
// first, under a SCOPED_TRACE naming it: a kernel test covers every level's path in one run.
void for_each_isa_level(const std::function<void(int level)>& body);

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-5;
  double rtol = 1e-4;
};

// fn maps the inputs to one output. Inputs that require grad are checked: the
// gradient of <w, fn(x)> for a random w, computed by autograd (backward with an
// explicit gradient), is compared with central differences of the same function.
// The inputs may live on a device (f64 there too): w is sent to the output's device, each
// element is perturbed in place on the device, and everything read comes back to the host.
::testing::AssertionResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                     const std::vector<Tensor>& inputs, GradcheckOptions opts = {});


// f64 leaf with N(0,1) values from `seed` (requires grad by default).
Tensor randn64(const Shape& shape, uint64_t seed, bool requires_grad = true);
// f64 leaf with uniform values in [lo, hi).
Tensor uniform64(const Shape& shape, double lo, double hi, uint64_t seed, bool requires_grad = true);
// Same values and requires_grad, laid out non-contiguously (dims reversed in
// memory for >= 2-D, stride 2 for 1-D). A leaf.
Tensor make_noncontiguous(const Tensor& t);

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double atol, double rtol);
#define EXPECT_CLOSE(actual, expected, atol, rtol) EXPECT_TRUE(::athanor::testing::all_close((actual), (expected), (atol), (rtol)))

// A test that needs data or a helper program the machine lacks (Fashion-MNIST, the npm
// corpora, the athanor CLI) is skipped on a developer's machine, but fails when CI=true: a
// broken data fetch or build must not pass CI as a row of skips. (Hardware a CPU lacks is
// a plain skip.) `what` may stream: ATHANOR_SKIP_IF_MISSING(!ok, "no vocabulary in " << dir).
bool ci_run();  // the CI environment variable is "true"
#define ATHANOR_SKIP_IF_MISSING(missing, what)                                                           \
  do {                                                                                                 \
    if (missing) {                                                                                     \
      if (::athanor::testing::ci_run()) GTEST_FAIL() << "missing under CI=true (set up the machine with " \
                                                        "scripts/setup.sh and build every target): " << what; \
      else GTEST_SKIP() << what;                                                                       \
    }                                                                                                  \
  } while (0)

// Runs fn and returns the athanor::Error message it throws (fails the test if it does not throw).
std::string error_message(const std::function<void()>& fn);

// Naive-reference helpers for tests that index by coordinates:
// the value at logical coordinates `c` of a row-major vector of shape `s`,
double at(const std::vector<double>& v, const Shape& s, const Shape& c);
// and fn(coords) for every coordinate of shape `s`, in row-major order.
void for_each_index(const Shape& s, const std::function<void(const Shape&)>& fn);
// An f32 leaf that requires grad, N(0, 1) from `seed` (a parameter for op tests).
Tensor random_leaf(const Shape& shape, uint64_t seed);
// An empty directory <tmp>/athanor_test_<name> (removed first if it exists).
std::string fresh_temp_dir(const std::string& name);
// A small English-like text file in `dir` for language-model runs (no npm data needed).
std::string write_tiny_text(const std::string& dir);
// t's elements as raw bytes, row-major, copied to the host (bit-for-bit comparisons of any
// dtype and device).
std::string tensor_bytes(const Tensor& t);
// n values scale * N(0, 1) from `seed`, as f32.
std::vector<float> random_floats(int64_t n, uint64_t seed, double scale);

// Bytes fn allocates on top of what is live before it (the allocator's high-water mark).
std::size_t peak_alloc_delta(const std::function<void()>& fn);

// A linear-shaped op fn(x, W, b) (linear, gelu_linear, linear_relu, …) run on fresh leaves,
// under bf16 autocast if asked, and backpropagated from dy outside the autocast region (as
// in PyTorch): the output and the three gradients.
struct LinearLikeResult {
  Tensor y, dx, dw, db;
};
LinearLikeResult run_linear_like(Tensor (*fn)(const Tensor&, const Tensor&, const Tensor&), const Tensor& x0,
                                 const Tensor& w0, const Tensor& b0, const Tensor& dy, bool bf16_autocast = false);
// Activation bytes (MemTag::activation, the trainer's forward tag) a linear-shaped op's forward
// on a fresh leaf copy of x0 leaves alive with its graph, and its forward peak; both over what
// was live before.
struct ForwardActivationBytes {
  std::size_t live = 0, peak = 0;
};
ForwardActivationBytes linear_like_forward_activation_bytes(Tensor (*fn)(const Tensor&, const Tensor&, const Tensor&),
                                                            const Tensor& x0, const Tensor& w, const Tensor& b);

}  // namespace athanor::testing
