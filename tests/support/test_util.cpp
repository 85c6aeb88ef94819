#include "test_util.h"

#include "op_case_gradcheck.h"

#include "athanor/core/allocator.h"
#include "athanor/ops/autocast.h"
#include "backend/cpu/isa.h"

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace athanor::testing {

bool ci_run() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

void note_isa(const std::string& what) {
  const std::string line = std::string("kernels ") + cpu::isa_name(cpu::active_isa()) + " (CPU: " +
                           cpu::isa_name(cpu::isa_supported()) + "), oneDNN " + cpu::onednn_isa_name() +
                           (what.empty() ? "" : "; " + what);
  std::printf("[ isa      ] %s\n", line.c_str());
  ::testing::Test::RecordProperty("isa", line);
}

void for_each_isa_level(const std::function<void(int level)>& body) {
  for (const cpu::Isa level : cpu::isa_supported_levels()) {
    SCOPED_TRACE(std::string("isa level ") + cpu::isa_name(level));
    const cpu::ScopedIsa at(level);
    note_isa();
    body(static_cast<int>(level));
  }
}
namespace {
// Element offset (in elements, from the tensor's data pointer) of logical index `lin`.
int64_t element_offset(const Tensor& t, int64_t lin) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t c = lin % t.sizes()[d];
    lin /= t.sizes()[d];
    off += c * t.strides()[d];
  }
  return off;
}

double dot(const Tensor& a, const std::vector<double>& w) {
  const auto v = a.to_vector();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}
}  // namespace

Tensor randn64(const Shape& shape, uint64_t seed, bool requires_grad) {
  Generator g(seed);
  Tensor t = randn(shape, TensorOptions(DType::f64), g);
  if (requires_grad) t.requires_grad_(true);
  return t;
}

Tensor uniform64(const Shape& shape, double lo, double hi, uint64_t seed, bool requires_grad) {
  Generator g(seed);
  Tensor t = empty(shape, TensorOptions(DType::f64));
  uniform_(t, lo, hi, g);
  if (requires_grad) t.requires_grad_(true);
  return t;
}

Tensor make_noncontiguous(const Tensor& t) {
  Tensor v;
  if (t.dim() >= 2) {
    Shape rev(t.sizes().rbegin(), t.sizes().rend());
    Tensor base = empty(rev, TensorOptions(t.dtype()));
    Shape st(t.dim());
    for (int64_t i = 0; i < t.dim(); ++i) st[i] = base.strides()[t.dim() - 1 - i];
    v = make_view(base, t.sizes(), st, 0);
  } else if (t.dim() == 1) {
    Tensor base = empty({2 * t.size(0) + 1}, TensorOptions(t.dtype()));
    v = make_view(base, t.sizes(), {2}, 1);
  } else {
    v = empty({}, TensorOptions(t.dtype()));
  }
  copy_into(v, t);
  if (t.requires_grad()) v.requires_grad_(true);
  return v;
}

::testing::AssertionResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                     const std::vector<Tensor>& inputs, GradcheckOptions opts) {
  for (const Tensor& in : inputs)
    if (in.defined() && in.requires_grad() && in.dtype() != DType::f64)
      return ::testing::AssertionFailure() << "gradcheck needs f64 inputs, got " << in.describe();
  for (const Tensor& in : inputs)
    if (in.defined() && in.requires_grad()) in.set_grad(Tensor());

  Tensor out = fn(inputs);
  if (!out.requires_grad()) return ::testing::AssertionFailure() << "output does not require grad";
  Generator wg(12345);
  Tensor w = randn(out.sizes(), TensorOptions(out.dtype()), wg);
  const std::vector<double> wv = w.to_vector();
  backward({out}, {out.device().is_cpu() ? w : w.to(out.device())});

  std::ostringstream failures;
  int bad = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& in = inputs[k];
    if (!in.defined() || !in.requires_grad()) continue;
    Tensor g = in.grad();
    std::vector<double> analytic = g.defined() ? g.to_vector() : std::vector<double>(in.numel(), 0.0);  // to_vector: to the host
    // Element i set to v: in place in host memory, or on the device through a 0-d view of it.
    const bool on_host = in.device().is_cpu();
    double* data = on_host ? in.data_ptr<double>() : nullptr;
    const std::vector<double> values = on_host ? std::vector<double>() : in.to_vector();
    auto set = [&](int64_t off, double v) {
      if (on_host) data[off] = v;
      else copy_into(make_view(in, {}, {}, in.storage_offset() + off), full({}, v, TensorOptions(DType::f64)));
    };
    for (int64_t i = 0; i < in.numel(); ++i) {
      const int64_t off = element_offset(in, i);
      const double orig = on_host ? data[off] : values[static_cast<size_t>(i)];
      double fp, fm;
      {
        NoGradGuard ng;
        set(off, orig + opts.eps);
        fp = dot(fn(inputs), wv);
        set(off, orig - opts.eps);
        fm = dot(fn(inputs), wv);
        set(off, orig);
      }
      const double numeric = (fp - fm) / (2 * opts.eps);
      const double diff = std::fabs(numeric - analytic[i]);
      if (!(diff <= opts.atol + opts.rtol * std::fabs(numeric))) {
        if (++bad <= 5)
          failures << "\n  input " << k << " " << in.describe() << " element " << i << ": autograd " << analytic[i]
                   << " vs finite difference " << numeric << " (diff " << diff << ")";
      }
    }
  }
  if (bad) return ::testing::AssertionFailure() << bad << " gradient element(s) differ:" << failures.str();
  return ::testing::AssertionSuccess();
}

std::vector<Tensor> floating_outputs(const std::vector<Tensor>& outs) {
  std::vector<Tensor> r;
  for (const Tensor& o : outs)
    if (o.defined() && is_floating(o.dtype())) r.push_back(o);
  return r;
}

::testing::AssertionResult op_case_gradcheck(const OpCase& c, const std::vector<Tensor>& inputs, GradcheckOptions opts) {
  // One output for the gradcheck: the floating outputs flattened and joined.
  auto fn = [&c](const std::vector<Tensor>& x) {
    const std::vector<Tensor> outs = floating_outputs(c.call(x));
    if (outs.size() == 1) return outs[0];
    std::vector<Tensor> flat;
    for (const Tensor& o : outs) flat.push_back(reshape(o, {-1}));
    return cat(flat, 0);
  };
  return gradcheck(fn, inputs, opts);
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double atol, double rtol) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.describe() << " != expected " << expected.describe();
  const auto a = actual.to_vector(), e = expected.to_vector();
  int64_t worst = -1, bad = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double tol = atol + rtol * std::fabs(e[i]);
    const double d = std::fabs(a[i] - e[i]);
    const bool same_nonfinite = (std::isnan(a[i]) && std::isnan(e[i])) || (std::isinf(a[i]) && a[i] == e[i]);
    if (!same_nonfinite && !(d <= tol)) {
      ++bad;
      if (worst < 0 || d - tol > worst_excess || std::isnan(d)) worst = static_cast<int64_t>(i), worst_excess = d - tol;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements differ (atol " << atol << ", rtol "
                                       << rtol << "); worst at " << worst << ": " << a[worst] << " vs expected "
                                       << e[worst];
}

std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected athanor::Error, got another exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an athanor::Error, but nothing was thrown";
  return "";
}

double at(const std::vector<double>& v, const Shape& s, const Shape& c) {
  int64_t lin = 0;
  for (size_t d = 0; d < s.size(); ++d) lin = lin * s[d] + c[d];
  return v[lin];
}

void for_each_index(const Shape& s, const std::function<void(const Shape&)>& fn) {
  const int64_t n = shape_numel(s);
  Shape c(s.size(), 0);
  for (int64_t lin = 0; lin < n; ++lin) {
    int64_t rem = lin;
    for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) c[d] = rem % s[d], rem /= s[d];
    fn(c);
  }
}

Tensor random_leaf(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  Tensor t = randn(shape, {}, g);
  t.requires_grad_(true);
  return t;
}

std::string tensor_bytes(const Tensor& t) {
  const Tensor c = t.cpu().contiguous();
  return {static_cast<const char*>(c.raw_data()), static_cast<size_t>(c.nbytes())};
}

std::string fresh_temp_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / ("athanor_test_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

std::string write_tiny_text(const std::string& dir) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 17) + ". ";
  const std::string path = dir + "/tiny.txt";
  std::ofstream(path) << text;
  return path;
}

std::vector<float> random_floats(int64_t n, uint64_t seed, double scale) {
  Generator g(seed);
  Tensor t = randn({n}, {}, g);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * t.data_ptr<float>()[i]);
  return v;
}

std::size_t peak_alloc_delta(const std::function<void()>& fn) {
  Allocator& a = Allocator::cpu();
  const std::size_t before = a.stats().current_total;
  a.reset_peak();
  fn();
  return a.stats().peak_total - before;
}

LinearLikeResult run_linear_like(Tensor (*fn)(const Tensor&, const Tensor&, const Tensor&), const Tensor& x0,
                                 const Tensor& w0, const Tensor& b0, const Tensor& dy, bool bf16_autocast) {
  Tensor x = x0.detach().requires_grad_(true), w = w0.detach().requires_grad_(true), b = b0.detach().requires_grad_(true);
  Tensor y;
  {
    autocast ac(DType::bf16, bf16_autocast);
    y = fn(x, w, b);
  }
  y.backward(dy.to(y.dtype()));
  return {y, x.grad(), w.grad(), b.grad()};
}

ForwardActivationBytes linear_like_forward_activation_bytes(Tensor (*fn)(const Tensor&, const Tensor&, const Tensor&),
                                                            const Tensor& x0, const Tensor& w, const Tensor& b) {
  Allocator& a = Allocator::cpu();
  MemTagScope tag(MemTag::activation);
  Tensor x = x0.detach().clone().requires_grad_(true);  // outside the measurement
  const std::size_t before = a.stats().of(MemTag::activation);
  a.reset_peak();
  Tensor y = fn(x, w, b);  // y and its graph stay alive while measured
  const MemoryStats s = a.stats();
  return {s.of(MemTag::activation) - before, s.peak_of(MemTag::activation) - before};
}

}  // namespace athanor::testing
