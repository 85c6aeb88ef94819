// The op harness (ggml's test-backend-ops, over the registry): for every registered op,
// every device with a kernel (the CPU here) and every dtype the op supports, on the inputs
// the op registers (athanor/ops/op_harness.h):
//  1. reference: the fast kernel (through the functional API) against the naive reference
//     kernel, at every ISA level this CPU supports, with the tolerances stated per dtype;
//  2. gradcheck: autograd's gradient against central finite differences, in f64;
//  3. autocast: under bf16 autocast the dispatch point runs the op at its category's dtype;
//  4. perf: each case timed forward and backward (perf mode), and two runs of it give the
//     same bits (a step is a function of its inputs).
// And the registry itself: every entry has all its pieces (a planted incomplete entry is
// caught), and every function of the functional API is an op or is built from ops.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "athanor/ops/autocast.h"
#include "athanor/ops/op_harness.h"
#include "op_case_gradcheck.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

// What every entry must have; one line per missing piece.
std::vector<std::string> problems(const OpDef& op) {
  std::vector<std::string> p;
  if (op.name.empty()) p.push_back("no name");
  if (op.inputs.empty()) p.push_back("no input names");
  if (!op.category) p.push_back("no autocast category");
  if (!op.reference) p.push_back("no reference kernel");
  if (!op.has_kernel(DeviceType::cpu)) p.push_back("no cpu kernel");
  for (DeviceType d : {DeviceType::cpu, DeviceType::cuda})
    if (op.has_kernel(d) && !op.kernels[device_slot(d)].backward)
      p.push_back(std::string("a ") + device_type_name(d) + " forward without a backward");
  if (op.dtypes.empty()) p.push_back("no dtypes");
  if (!op.cases) {
    p.push_back("no harness inputs");
  } else {
    const std::vector<OpCase> cases = op.cases(1);
    if (cases.empty()) p.push_back("no harness inputs");
    for (const OpCase& c : cases)
      if (!c.call || !c.args) p.push_back("case '" + c.label + "' has no call or no arguments");
  }
  if (op.derivative.empty()) p.push_back("no derivative");
  return p;
}

bool runs_in(const OpCase& c, DType dt) {
  return c.dtypes.empty() || std::find(c.dtypes.begin(), c.dtypes.end(), dt) != c.dtypes.end();
}

// Tolerances of the fast kernel against the reference, per dtype: |fast - ref| <= atol S +
// rtol |ref|, with S the largest |ref| of the output (at least 1), so that a sum that cancels
// to near zero is held to the scale of its terms. f64: the kernels differ from the
// references in summation order only. f32: a few ulps (2^-23 ~ 1.2e-7) per accumulated term
// over the harness's short sums, and the vector exp/log/tanh polynomials (a few ulps). bf16
// and f16: the kernels compute in f32 and round their outputs once (half an ulp: 2^-9 and
// 2^-12), and a few round an intermediate too (attention's probabilities, gelu's h), so two
// ulps of the dtype.
struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance(DType dt) {
  switch (dt) {
    case DType::f64: return {1e-12, 1e-12};
    case DType::f32: return {1e-5, 1e-5};
    case DType::bf16: return {8e-3, 8e-3};
    case DType::f16: return {1e-3, 1e-3};
    default: return {0, 0};
  }
}
// The coarser of two dtypes' tolerances (a cast's output has the target dtype's rounding).
Tolerance coarser(DType a, DType b) {
  const Tolerance ta = tolerance(a), tb = tolerance(b);
  return ta.atol >= tb.atol ? ta : tb;
}

::testing::AssertionResult close_to_reference(const Tensor& fast, const Tensor& ref, Tolerance tol) {
  if (fast.sizes() != ref.sizes())
    return ::testing::AssertionFailure() << "shape " << shape_str(fast.sizes()) << " vs reference " << shape_str(ref.sizes());
  const std::vector<double> f = fast.to_vector(), r = ref.to_vector();
  double scale = 1.0;
  for (double v : r)
    if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < f.size(); ++i) {
    const bool both_nan = std::isnan(f[i]) && std::isnan(r[i]);
    if (both_nan || f[i] == r[i]) continue;
    const double bound = tol.atol * scale + tol.rtol * std::fabs(r[i]);
    if (!(std::fabs(f[i] - r[i]) <= bound))
      return ::testing::AssertionFailure() << "element " << i << ": fast " << f[i] << " vs reference " << r[i] << " (|diff| "
                                           << std::fabs(f[i] - r[i]) << " > " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}

// Runs body; an Error it throws fails the test here, under the caller's SCOPED_TRACE (the op
// and case), instead of ending the whole test.
template <class Fn> void guarded(Fn&& body) {
  try {
    body();
  } catch (const Error& e) {
    ADD_FAILURE() << "threw: " << e.what();
  }
}

// Same shape, dtype and bytes (logical order).
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

}  // namespace

TEST(OpRegistry, EveryOpHasAllItsPieces) {
  std::set<std::string> names;
  for (const OpDef* op : op_registry()) {
    SCOPED_TRACE(op->name);
    EXPECT_TRUE(names.insert(op->name).second) << "registered twice";
    for (const std::string& p : problems(*op)) ADD_FAILURE() << op->name << ": " << p;
    EXPECT_EQ(find_op(op->name), op);
  }
  EXPECT_GE(op_registry().size(), 54u);
  EXPECT_EQ(find_op("no_such_op"), nullptr);
  std::printf("[ harness  ] %zu ops registered, each with a reference, a backward, harness inputs and a category\n",
              op_registry().size());
}

// The completeness check above must be able to fail: an entry missing each piece in turn.
TEST(OpRegistry, AnEntryMissingAPieceIsCaught) {
  const OpDef& good = *find_op("exp");
  ASSERT_TRUE(problems(good).empty());
  auto without = [&](auto&& strip) {
    OpDef d = good;
    strip(d);
    return problems(d);
  };
  EXPECT_FALSE(without([](OpDef& d) { d.reference = nullptr; }).empty()) << "a missing reference";
  EXPECT_FALSE(without([](OpDef& d) { d.kernels[device_slot(DeviceType::cpu)].backward = nullptr; }).empty())
      << "a missing backward";
  EXPECT_FALSE(without([](OpDef& d) { d.cases = nullptr; }).empty()) << "missing test inputs";
  EXPECT_FALSE(without([](OpDef& d) { d.cases = [](int) { return std::vector<OpCase>{}; }; }).empty()) << "no test inputs";
  EXPECT_FALSE(without([](OpDef& d) { d.category.reset(); }).empty()) << "a missing category";
  EXPECT_FALSE(without([](OpDef& d) { d.kernels[device_slot(DeviceType::cuda)].forward = d.kernels[0].forward; }).empty())
      << "a cuda forward without a backward";
}

// Every function the public ops headers declare is a registered op or is built from them
// (athanor::api_functions); every such function exists; its parts are registered.
TEST(OpRegistry, TheFunctionalApiHasNoOpOutsideTheRegistry) {
  const std::filesystem::path dir = std::filesystem::path(ATHANOR_SOURCE_DIR) / "include/athanor/ops";
  const std::set<std::string> infrastructure = {"registry.h", "op_harness.h", "autocast.h"};
  const std::regex decl(R"(^\s*(?:inline\s+)?(?:Tensor|std::vector<Tensor>|Shape)\s+(\w+)\()");
  std::set<std::string> declared;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (infrastructure.count(e.path().filename().string())) continue;
    std::ifstream f(e.path());
    std::string line;
    std::smatch m;
    while (std::getline(f, line))
      if (std::regex_search(line, m, decl)) declared.insert(m[1]);
  }
  ASSERT_GT(declared.size(), 50u) << "the header scan found too few functions in " << dir;
  std::map<std::string, std::string> composites;
  for (const ApiFunction& f : api_functions()) composites[f.name] = f.built_from;
  for (const std::string& name : declared)
    EXPECT_TRUE(find_op(name) || composites.count(name))
        << "the functional API exposes '" << name << "' but the registry lacks it (register it, or list it in "
        << "api_functions() with the ops it is built from)";
  for (const auto& [name, parts] : composites) {
    EXPECT_TRUE(declared.count(name)) << "api_functions() lists '" << name << "', which no public header declares";
    std::stringstream ss(parts);
    std::string part;
    while (std::getline(ss, part, ',')) {
      part.erase(0, part.find_first_not_of(' '));
      EXPECT_NE(find_op(part), nullptr) << name << " is built from '" << part << "', which is not registered";
    }
  }
}

TEST(OpHarness, FastKernelsMatchTheReference) {
  std::map<std::string, int> runs;
  int total = 0;
  for_each_isa_level([&](int) {
    for (const OpDef* op : op_registry()) {
      if (!op->has_kernel(DeviceType::cpu)) continue;
      for (const OpCase& c : op->cases(1))
        for (DType dt : op->dtypes) {
          if (!runs_in(c, dt)) continue;
          SCOPED_TRACE(op->name + " on cpu, " + dtype_name(dt) + ": " + c.label);
          guarded([&] {
          NoGradGuard ng;
          const std::vector<Tensor> in = case_tensors(c, dt, false);
          const std::vector<Tensor> fast = c.call(in);
          // The reference sees the same (dtype-rounded) values, widened to f64.
          std::vector<Tensor> in64;
          for (const Tensor& t : in) in64.push_back(t.defined() && is_floating(t.dtype()) ? t.to(DType::f64) : t);
          const std::vector<Tensor> ref = run_reference(*op, in64, c.args.get(), *c.args_type);
          ASSERT_EQ(fast.size(), ref.size());
          for (size_t k = 0; k < fast.size(); ++k)
            EXPECT_TRUE(close_to_reference(fast[k], ref[k], coarser(dt, fast[k].dtype()))) << "output " << k;
          });
          ++runs[op->name];
          ++total;
        }
    }
  });
  EXPECT_EQ(runs.size(), op_registry().size()) << "an op ran no reference comparison";
  std::printf("[ harness  ] reference: %zu ops, %d case x dtype x ISA-level runs against the reference kernels\n", runs.size(),
              total);
}

TEST(OpHarness, GradientsMatchFiniteDifferencesInF64) {
  int cases = 0;
  std::set<std::string> ops, exempt;
  for (const OpDef* op : op_registry())
    for (const OpCase& c : op->cases(1)) {
      SCOPED_TRACE(op->name + ": " + c.label);
      if (!c.no_gradcheck.empty()) {
        std::printf("[ harness  ] gradcheck: %s, case '%s' not checked: %s\n", op->name.c_str(), c.label.c_str(),
                    c.no_gradcheck.c_str());
        exempt.insert(op->name);
        continue;
      }
      const std::vector<Tensor> in = case_tensors(c, DType::f64, true);
      bool any = false;
      for (const Tensor& t : in) any = any || (t.defined() && t.requires_grad());
      if (!any) continue;
      guarded([&] { EXPECT_TRUE(op_case_gradcheck(c, in)); });  // op_case_gradcheck.h: shared with the GPU's
      ops.insert(op->name);
      ++cases;
    }
  // Every op but cast (whose every cast from f64 narrows) has cases finite differences check.
  std::set<std::string> unchecked;
  for (const OpDef* op : op_registry())
    if (!ops.count(op->name)) unchecked.insert(op->name);
  EXPECT_EQ(unchecked, std::set<std::string>{"cast"}) << "an op had no case with an input to differentiate";
  std::printf("[ harness  ] gradcheck: %zu ops, %d cases in f64 against central differences\n", ops.size(), cases);
}

// Under autocast(bf16): lower_precision ops compute in bf16 from f32 inputs, f32 ops give an
// f32 result from bf16 inputs, promote and passthrough ops keep what they give without
// autocast. (The dispatch point applies the category; no op reads it itself.)
TEST(OpHarness, AutocastRunsEachOpAtItsCategorysDtype) {
  int checked = 0;
  std::set<std::string> ops;
  for (const OpDef* op : op_registry())
    for (const OpCase& c : op->cases(1)) {
      SCOPED_TRACE(op->name + ": " + c.label);
      NoGradGuard ng;
      const AutocastCategory cat = *op->category;
      const DType in_dt = cat == AutocastCategory::f32 ? DType::bf16 : DType::f32;
      if (!runs_in(c, in_dt)) continue;
      const std::vector<Tensor> in = case_tensors(c, in_dt, false);
      const std::vector<Tensor> plain = floating_outputs(c.call(in));
      std::vector<Tensor> mixed;
      {
        autocast ac(DType::bf16);
        mixed = floating_outputs(c.call(in));
      }
      ASSERT_EQ(plain.size(), mixed.size());
      for (size_t k = 0; k < mixed.size(); ++k) {
        const DType want = cat == AutocastCategory::lower_precision ? DType::bf16
                           : cat == AutocastCategory::f32           ? DType::f32
                                                                    : plain[k].dtype();
        EXPECT_EQ(mixed[k].dtype(), want) << "output " << k << " under autocast (category "
                                          << autocast_category_name(cat) << ")";
      }
      ops.insert(op->name);
      ++checked;
    }
  EXPECT_EQ(ops.size(), op_registry().size());
  std::printf("[ harness  ] autocast: %zu ops, %d cases at their category's dtype\n", ops.size(), checked);
}

TEST(OpHarness, PerfModeTimesEveryCaseAndRepeatsItsBits) {
  int timed = 0;
  double fwd_us = 0, bwd_us = 0;
  std::set<std::string> ops;
  for (const OpDef* op : op_registry())
    for (const OpCase& c : op->cases(1))
      for (DType dt : op->dtypes) {
        if (!runs_in(c, dt)) continue;
        SCOPED_TRACE(op->name + ", " + dtype_name(dt) + ": " + c.label);
        guarded([&] {
        const OpTiming t = time_case(c, dt, 2);
        EXPECT_TRUE(std::isfinite(t.forward_us) && t.forward_us > 0) << t.forward_us;
        EXPECT_TRUE(t.backward_us < 0 || std::isfinite(t.backward_us));
        fwd_us += t.forward_us, bwd_us += std::max(t.backward_us, 0.0);
        NoGradGuard ng;
        const std::vector<Tensor> in = case_tensors(c, dt, false);
        const std::vector<Tensor> a = c.call(in), b = c.call(in);
        ASSERT_EQ(a.size(), b.size());
        for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(same_bits(a[k], b[k])) << "output " << k << " differs between two runs";
        });
        ops.insert(op->name);
        ++timed;
      }
  EXPECT_EQ(ops.size(), op_registry().size());
  std::printf("[ harness  ] perf: %zu ops, %d case x dtype runs timed (forward %.0f us, backward %.0f us in all; "
              "`athanor ops --bench NAME` for one op at scale)\n",
              ops.size(), timed, fwd_us, bwd_us);
}

}  // namespace athanor
