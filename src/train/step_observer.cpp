// The trainer's measurements for the doctor and the per-layer views (step_observer.h).
#include "train/step_observer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "athanor/core/allocator.h"
#include "athanor/core/convert.h"
#include "athanor/dist/process_group.h"
#include "athanor/ops.h"
#include "athanor/ops/value_stats.h"

namespace athanor::train {
namespace {

// A contiguous view of t's values (t itself when contiguous), without recording an op.
// t's elements, contiguous, in host memory: the statistics are computed on the host, so a
// device tensor is downloaded here (on the statistics steps only: the logged ones).
Tensor dense(const Tensor& t) {
  if (t.is_contiguous() && t.device().is_cpu()) return t;
  Tensor c = empty(t.sizes(), TensorOptions(t.dtype()));
  copy_into(c, t);
  return c;
}

bool relu_like(const std::string& op) { return op == "relu" || op == "linear_relu"; }

// Whether t lives on a device: its statistics are computed there (value_stats.h), a few doubles
// read back; l2_norm keeps its own loop on the CPU.
bool on_device(const Tensor& t) { return t.defined() && !t.device().is_cpu(); }

// All of `ts` on one device other than the CPU: their norms in one device pass and read.
bool one_device(const std::vector<Tensor>& ts) {
  return !ts.empty() && on_device(ts[0]) &&
         std::all_of(ts.begin(), ts.end(), [&](const Tensor& t) { return t.defined() && t.device() == ts[0].device(); });
}

// The histogram's bucket limits over [mn, mx] (the last one mx itself).
std::vector<double> bucket_limits(double mn, double mx, int nb) {
  const double width = (mx - mn) / nb;
  std::vector<double> limits;
  for (int i = 0; i < nb; ++i) limits.push_back(i + 1 == nb ? mx : mn + width * (i + 1));
  return limits;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

double l2_norm(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype())) return 0;
  if (on_device(t)) return value_stats(t).l2_norm();
  double s = 0;
  const Tensor c = dense(t);
  const int64_t n = c.numel();
  dispatch(c.dtype(), [&]<class T>() {
    const T* d = static_cast<const T*>(c.raw_data());
    // Four partial sums: independent chains the compiler can keep in flight.
    double a[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; ++k) {
        const double v = cast_value<double>(d[i + k]);
        a[k] += v * v;
      }
    for (; i < n; ++i) {
      const double v = cast_value<double>(d[i]);
      a[0] += v * v;
    }
    s = a[0] + a[1] + a[2] + a[3];
  });
  return std::sqrt(s);
}

observe::Histogram histogram(const std::string& tag, const Tensor& t, int buckets) {
  observe::Histogram h;
  h.tag = tag;
  // min, max and sums in one pass (one read on a device), then the counts in another.
  const TensorStats st = value_stats(t);
  h.num = st.finite, h.sum = st.sum, h.sum_squares = st.sum_squares;
  if (h.num == 0) return h;
  h.min = st.min, h.max = st.max;
  const int nb = std::max(1, buckets);
  const double width = (h.max - h.min) / nb;
  if (width <= 0) {  // one value: one bucket
    h.bucket.assign(1, h.num);
    h.bucket_limit.assign(1, h.max);
    return h;
  }
  h.bucket_limit = bucket_limits(h.min, h.max, nb);
  h.bucket = histogram_counts(t, h.min, width, h.bucket_limit);
  return h;
}

void StepObserver::before_update(const optim::NamedTensors& named, observe::StepMetrics& m, bool keep_weights, bool histograms) {
  MemTagScope tag(MemTag::workspace);
  before_.clear();
  m.layers.clear();
  std::vector<Tensor> all;  // the parameters, then the gradients that exist
  for (const auto& [n, p] : named) all.push_back(p);
  for (const auto& [n, p] : named)
    if (p.grad().defined()) all.push_back(p.grad());
  std::vector<double> norms;
  if (one_device(all) && std::all_of(all.begin(), all.end(), [](const Tensor& t) { return is_floating(t.dtype()); })) {
    for (const TensorStats& st : value_stats_list(all)) norms.push_back(st.l2_norm());  // one device pass and read
  } else {
    for (const Tensor& t : all) norms.push_back(l2_norm(t));
  }
  size_t gi = named.size();
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [n, p] = named[i];
    const Tensor g = p.grad();
    m.layers.push_back({n, g.defined() ? norms[gi++] : 0.0, norms[i], -1.0, static_cast<int>(p.dim())});
    if (keep_weights) {  // kept where the weights live
      Tensor c = empty(p.sizes(), TensorOptions(p.dtype()).with_device(p.device()));
      copy_into(c, p);
      before_.push_back(c);
    }
    if (histograms) {
      m.histograms.push_back(histogram("weights/" + n, p));
      if (g.defined()) m.histograms.push_back(histogram("grads/" + n, g));
    }
  }
}

void StepObserver::after_update(const optim::NamedTensors& named, observe::StepMetrics& m) {
  if (before_.size() != named.size() || m.layers.size() != named.size()) return;
  std::vector<Tensor> params;
  for (const auto& np : named) params.push_back(np.second);
  const std::vector<double> diff = squared_distances(before_, params);  // ||W1 - W0||^2, one read on a device
  for (size_t i = 0; i < named.size(); ++i) {
    const double w = m.layers[i].param_norm;
    m.layers[i].update_ratio = w > 0 ? std::sqrt(diff[i]) / w : -1.0;
  }
  before_.clear();
}

namespace {
// The fraction of a ReLU layer's units that never fired in its record (accumulate_fired_units).
double dead_fraction(const Tensor& fired) {
  const std::vector<double> f = fired.cpu().to_vector();  // one read on a device
  return static_cast<double>(std::count(f.begin(), f.end(), 0.0)) / static_cast<double>(f.size());
}

// a's statistics of y from value_stats (one pass; one read on a device); with `dead`, the
// ReLU's dead fraction of this output alone.
observe::ActivationStats fill_activation_stats(observe::ActivationStats a, const std::string& op, const Tensor& y, bool dead) {
  const bool sig = op == "sigmoid", th = op == "tanh";
  const TensorStats st = value_stats(y, sig ? Saturation::sigmoid : th ? Saturation::tanh : Saturation::none);
  const double cnt = std::max(1.0, st.finite);
  a.mean = st.sum / cnt;
  a.std = std::sqrt(std::max(0.0, st.sum_squares / cnt - a.mean * a.mean));
  a.absmax = st.absmax;
  a.zero_frac = st.zeros / static_cast<double>(y.numel());
  if (dead) {
    Tensor fired;
    accumulate_fired_units(y, fired);
    a.dead_frac = dead_fraction(fired);
  }
  if (sig || th) a.saturated_frac = st.saturated / cnt;
  return a;
}

// Units of y: features (last dim) or channels (dim 1 of NCHW).
int64_t units_of(const Tensor& y) { return y.dim() == 0 ? 1 : y.dim() == 4 ? y.size(1) : y.size(-1); }
}  // namespace

observe::ActivationStats activation_stats(const std::string& name, const std::string& op, const Tensor& y) {
  observe::ActivationStats a;
  a.name = name;
  if (!y.defined() || !is_floating(y.dtype()) || y.numel() == 0) return a;
  a.units = units_of(y);
  return fill_activation_stats(std::move(a), op, y, /*dead=*/relu_like(op));
}

ForwardObserver StepObserver::observer(std::vector<observe::ActivationStats>* stats) {
  static const std::set<std::string> kLayerOps = {"linear", "linear_relu", "gelu_linear", "conv2d", "relu",
                                                  "gelu",   "tanh",        "sigmoid",     "silu"};
  return [this, stats](const char* op, const std::string& module_path, const Tensor& y) {
    const bool relu = relu_like(op);
    if (!(relu || (stats && kLayerOps.count(op))) || !y.defined() || !is_floating(y.dtype()) || y.dim() == 0) return;
    const std::string name = (module_path.empty() ? std::string("(root)") : module_path) + ":" + op;
    if (stats)
      for (const auto& a : *stats)
        if (a.name == name) return;  // a layer called twice in one forward keeps its first output
    if (relu) {  // the units that fired, over the window, recorded where y lives
      Tensor& rec = alive_[name];
      if (rec.defined() && (rec.size(0) != units_of(y) || rec.device() != y.device())) rec = Tensor();
      accumulate_fired_units(y, rec);
    }
    if (!stats) return;
    observe::ActivationStats a;
    a.name = name;
    a.units = units_of(y);
    a = fill_activation_stats(std::move(a), op, y, /*dead=*/false);
    if (relu) {  // the dead fraction from the window's record, not this output alone
      a.dead_frac = dead_fraction(alive_[name]);
      alive_.erase(name);  // the next window starts afresh
    }
    stats->push_back(std::move(a));
  };
}

ForwardObserver activation_observer(std::vector<observe::ActivationStats>& out) {
  static const std::set<std::string> kLayerOps = {"linear", "linear_relu", "gelu_linear", "conv2d", "relu",
                                                  "gelu",   "tanh",        "sigmoid",     "silu"};
  return [&out](const char* op, const std::string& module_path, const Tensor& y) {
    if (!kLayerOps.count(op)) return;
    const std::string name = (module_path.empty() ? std::string("(root)") : module_path) + ":" + op;
    // A layer called twice in one forward (shared weights) keeps its first output.
    for (const auto& a : out)
      if (a.name == name) return;
    out.push_back(activation_stats(name, op, y));
  };
}

observe::InputStats input_stats(const std::vector<data::Batch>& batches) {
  observe::InputStats s;
  double sum = 0, ss = 0;
  int64_t count = 0;
  std::vector<double> sample_max;
  for (const auto& b : batches) {
    if (!b.input.defined() || !is_floating(b.input.dtype()) || b.input.dim() == 0) return {};
    s.present = true;
    const int64_t rows = b.input.size(0), per = rows ? b.input.numel() / rows : 0;
    std::vector<double> row_max(static_cast<size_t>(rows), 0.0);
    std::vector<char> row_bad(static_cast<size_t>(rows), 0);
    const Tensor x = dense(b.input);
    // Per row: sums in 8 independent lanes (this runs every step, ~3 flops per input value);
    // a NaN or Inf anywhere makes the row's sum of squares non-finite.
    dispatch(x.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        const T* d = static_cast<const T*>(x.raw_data());
        for (int64_t r = 0; r < rows; ++r) {
          const T* row = d + r * per;
          double s8[8] = {0}, q8[8] = {0}, m8[8] = {0};
          int64_t i = 0;
          for (; i + 8 <= per; i += 8)
            for (int k = 0; k < 8; ++k) {
              const double v = cast_value<double>(row[i + k]);
              s8[k] += v;
              q8[k] += v * v;
              m8[k] = std::max(m8[k], std::fabs(v));
            }
          double rs = 0, rq = 0, rm = 0;
          for (; i < per; ++i) {
            const double v = cast_value<double>(row[i]);
            rs += v, rq += v * v, rm = std::max(rm, std::fabs(v));
          }
          for (int k = 0; k < 8; ++k) rs += s8[k], rq += q8[k], rm = std::max(rm, m8[k]);
          if (!std::isfinite(rq) || !std::isfinite(rs)) {
            row_bad[static_cast<size_t>(r)] = 1;
            continue;
          }
          sum += rs, ss += rq, count += per;
          row_max[static_cast<size_t>(r)] = rm;
        }
      }
    });
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = static_cast<size_t>(r) < b.sample_ids.size() ? b.sample_ids[static_cast<size_t>(r)] : -1;
      if (row_bad[static_cast<size_t>(r)]) {
        s.nonfinite_ids.push_back(id);
        continue;
      }
      sample_max.push_back(row_max[static_cast<size_t>(r)]);
      if (s.max_id < 0 || row_max[static_cast<size_t>(r)] > s.max_absmax) {
        s.max_absmax = row_max[static_cast<size_t>(r)];
        s.max_id = id;
      }
    }
    s.samples += rows;
  }
  if (!s.present) return s;
  const double n = static_cast<double>(std::max<int64_t>(1, count));
  s.mean = sum / n;
  s.std = std::sqrt(std::max(0.0, ss / n - s.mean * s.mean));
  s.absmax = s.max_absmax;
  s.median_absmax = median_of(sample_max);
  return s;
}

double label_entropy(const data::Dataset& set, int64_t max_samples, int64_t* classes) {
  const int64_t n = set.size();
  if (n <= 0) return -1;
  const int64_t take = std::min(n, std::max<int64_t>(1, max_samples));
  std::map<int64_t, double> counts;
  double total = 0;
  for (int64_t k = 0; k < take; ++k) {
    // Evenly spread over the set (a prefix of a sorted or time-ordered set would mislead).
    const int64_t idx = static_cast<int64_t>(static_cast<double>(k) * static_cast<double>(n) / static_cast<double>(take));
    const data::Sample s = set.get(idx);
    if (!s.target.defined() || is_floating(s.target.dtype())) return -1;
    for (double v : s.target.to_vector()) {
      if (v < 0) continue;  // ignore_index (-100) and the like
      counts[static_cast<int64_t>(v)] += 1;
      total += 1;
    }
  }
  if (total == 0) return -1;
  double h = 0;
  for (const auto& [c, k] : counts) h -= k / total * std::log(k / total);
  if (classes) *classes = static_cast<int64_t>(counts.size());
  return h;
}

std::vector<double> gather_across_ranks(dist::ProcessGroup* group, double v) {
  if (!group) return {v};
  const int world = group->size();
  Tensor in = full({1}, 0.0, {DType::i64});
  in.data_ptr<int64_t>()[0] = std::bit_cast<int64_t>(v);
  Tensor out = full({world}, 0.0, {DType::i64});
  group->all_gather(out, in);
  std::vector<double> r(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) r[static_cast<size_t>(i)] = std::bit_cast<double>(out.data_ptr<int64_t>()[i]);
  return r;
}

}  // namespace athanor::train
