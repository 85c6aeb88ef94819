// The update rules. Each optimizer is one fused pass per parameter over
// (param, grad, state...) in its own dtype (f32 or f64), parallel over elements;
// SGD and Adam/AdamW run all f32 parameters as one multi-tensor pass
// (over_all_chunks: one parallel region for the whole model) of the AVX-512
// kernels in fused_update.cpp, which also write the low-precision copies.
// Formulas follow PyTorch's torch.optim (SGD, RMSprop, Adam, AdamW) and the
// papers for LAMB (You et al. 2019, "Large Batch Optimization for Deep
// Learning") and LARS (You et al. 2017, "Large Batch Training of Convolutional
// Networks").
// Parameters on a CUDA device (SGD, Adam, AdamW; f32): the same constants, one multi-tensor
// kernel launch per group after the loop (optim/device_update.h), asynchronous on the compute
// stream, writing the low-precision copies too when they are on (the lowp_copies candidate);
// the others refuse them (Optimizer::steps_on_cuda).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/optim/optimizer.h"
#include "optim/device_update.h"
#include "optim/fused_update.h"
#include "backend/cpu/stealing_runs.h"

namespace athanor::optim {
namespace {

constexpr int64_t kGrain = 1 << 14;

// Runs fn.template operator()<T>() for the parameter's dtype (f32 or f64).
template <class Fn> void by_dtype(const Tensor& p, Fn&& fn) {
  if (p.dtype() == DType::f64) fn.template operator()<double>();
  else fn.template operator()<float>();
}

template <class T> T* ptr(const Tensor& t) { return static_cast<T*>(t.raw_data()); }

template <class T> double sq_norm(const T* x, int64_t n) {
  double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

// f32 parameters go through one multi-tensor pass (cpu::for_each_chunk, backend/cpu/stealing_runs.h); each element is
// updated exactly as in a per-tensor loop, so results do not depend on the chunking or
// the thread count.
constexpr int64_t kChunk = 1 << 13;  // 32 KiB of f32: long enough for the vector loop, small enough to balance
template <class Body> void over_all_chunks(const std::vector<int64_t>& sizes, const Body& body) {
  int64_t total = 0;
  for (const int64_t n : sizes) total += n;
  cpu::for_each_chunk(sizes, kChunk, total > kGrain, [&](int k, int64_t begin, int64_t end, int64_t) { body(k, begin, end); });
}

class SGD final : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> g, SgdOptions o) : Optimizer(std::move(g)), o_(o) {}
  std::string name() const override { return "sgd"; }
  void step() override {
    // f32 parameters in one multi-tensor pass (see over_all_chunks), f64 ones per tensor.
    work_.clear(), sizes_.clear(), published_.clear(), device_work_.clear();
    for_each_param([&](ParamGroup& g, const std::string& name, Tensor& p, const Tensor& grad) {
      double* dstep = device_step(name, p);  // guarded: the count on the device decides `first`
      const bool first = param_step(name)++ == 0;
      Tensor buf = o_.momentum != 0 ? state(name, "momentum_buffer", p) : Tensor();
      if (p.dtype() == DType::f32) {
        const float damp = static_cast<float>(o_.dampening);
        const detail::SgdConsts k{static_cast<float>(g.lr), static_cast<float>(g.weight_decay),
                                  static_cast<float>(o_.momentum), 1.0f - damp, o_.nesterov, first, grad_scale()};
        if (!p.device().is_cpu()) {  // the device's multi-tensor pass (after the loop), its copy written in it
          void* copy = copy_buffer(name, p);
          device_work_.push_back({static_cast<float*>(p.device_data()), static_cast<const float*>(grad.device_data()),
                                  buf.defined() ? static_cast<float*>(buf.device_data()) : nullptr, p.numel(), k, dstep,
                                  copy});
          device_ = p.device().index;
          if (copy) published_.emplace_back(&name, p);
          return;
        }
        void* copy = copy_buffer(name, p);
        work_.push_back({ptr<float>(p), ptr<float>(grad), buf.defined() ? ptr<float>(buf) : nullptr,
                         static_cast<char*>(copy), k});
        sizes_.push_back(p.numel());
        if (copy) published_.emplace_back(&name, p);
        return;
      }
      const Work64 wk{ptr<double>(p), ptr<double>(grad), buf.defined() ? ptr<double>(buf) : nullptr, g.lr,
                      g.weight_decay, o_.momentum, o_.dampening, o_.nesterov, first};
      const int64_t n = p.numel();
#pragma omp parallel for if (n > kGrain)
      for (int64_t i = 0; i < n; ++i) update(wk, i);
    });
    const DType cd = low_precision_copies();
    const int64_t csize = static_cast<int64_t>(dtype_size(cd));
    over_all_chunks(sizes_, [&](int k, int64_t begin, int64_t end) {
      const WorkF32& w = work_[k];
      detail::sgd_f32(w.w + begin, w.g + begin, w.b ? w.b + begin : nullptr, end - begin, w.k,
                      w.copy ? w.copy + begin * csize : nullptr, cd);
    });
    if (!device_work_.empty()) {
      const detail::DeviceStepGuard guard{guard_skip(), guard_grad_scale()};
      detail::sgd_on_device(device_, device_work_, cd, guard.skip ? &guard : nullptr);
      advance_device_steps(device_);
    }
    for (const auto& [name, p] : published_) publish_copy(*name, p);
    refresh_packed_weights();
    ++steps_;
  }

 private:
  bool writes_copies_in_pass() const override { return true; }
  bool folds_grad_scale() const override { return true; }
  bool steps_on_cuda() const override { return true; }
  struct WorkF32 {
    float* w;
    const float* g;
    float* b;  // momentum buffer, or null
    char* copy;  // low-precision copy, or null
    detail::SgdConsts k;
  };
  struct Work64 {
    double* w;
    const double* gr;
    double* b;  // momentum buffer, or null
    double lr, wd, mom, damp;
    bool nesterov, first;
  };
  static inline void update(const Work64& k, int64_t i) {
    double d = k.gr[i] + k.wd * k.w[i];  // L2 weight decay enters the gradient
    if (k.b) {
      k.b[i] = k.first ? d : k.mom * k.b[i] + (1.0 - k.damp) * d;  // the first step seeds the buffer with d
      d = k.nesterov ? d + k.mom * k.b[i] : k.b[i];
    }
    k.w[i] -= k.lr * d;
  }
  SgdOptions o_;
  // Per-step scratch, kept to reuse its capacity (no allocation per step).
  std::vector<WorkF32> work_;
  std::vector<int64_t> sizes_;
  std::vector<std::pair<const std::string*, Tensor>> published_;
  std::vector<detail::SgdDeviceWork> device_work_;  // parameters on a CUDA device (one device)
  int device_ = 0;
};

class RMSprop final : public Optimizer {
 public:
  RMSprop(std::vector<ParamGroup> g, RmspropOptions o) : Optimizer(std::move(g)), o_(o) {}
  std::string name() const override { return "rmsprop"; }
  void step() override {
    for_each_param([&](ParamGroup& g, const std::string& name, Tensor& p, const Tensor& grad) {
      ++param_step(name);
      Tensor sq = state(name, "square_avg", p);
      Tensor ga = o_.centered ? state(name, "grad_avg", p) : Tensor();
      Tensor buf = o_.momentum > 0 ? state(name, "momentum_buffer", p) : Tensor();
      by_dtype(p, [&]<class T>() {
        T* w = ptr<T>(p);
        const T* gr = ptr<T>(grad);
        T *s = ptr<T>(sq), *a = ga.defined() ? ptr<T>(ga) : nullptr, *b = buf.defined() ? ptr<T>(buf) : nullptr;
        const T lr = g.lr, wd = g.weight_decay, alpha = o_.alpha, eps = o_.eps, mom = o_.momentum;
        const int64_t n = p.numel();
#pragma omp parallel for if (n > kGrain)
        for (int64_t i = 0; i < n; ++i) {
          const T d = gr[i] + wd * w[i];
          s[i] = alpha * s[i] + (T(1) - alpha) * d * d;             // running mean of g^2
          T var = s[i];
          if (a) {                                                   // centered: subtract (mean g)^2
            a[i] = alpha * a[i] + (T(1) - alpha) * d;
            var -= a[i] * a[i];
          }
          const T step = d / (std::sqrt(var) + eps);
          if (b) {
            b[i] = mom * b[i] + step;
            w[i] -= lr * b[i];
          } else {
            w[i] -= lr * step;
          }
        }
      });
    });
    refresh_packed_weights();
    ++steps_;
  }
 private:
  RmspropOptions o_;
};

class Adam final : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> g, AdamOptions o, bool decoupled) : Optimizer(std::move(g)), o_(o), decoupled_(decoupled) {}
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }
  void step() override {
    // f32 parameters are gathered and updated in one multi-tensor pass; f64 ones
    // (gradchecks, tests) keep a loop per tensor.
    work_.clear(), sizes_.clear(), published_.clear(), device_work_.clear();
    for_each_param([&](ParamGroup& g, const std::string& name, Tensor& p, const Tensor& grad) {
      double* dstep = device_step(name, p);  // guarded: the bias corrections come from the device's count
      const int64_t t = ++param_step(name);
      Tensor m = state(name, "exp_avg", p), v = state(name, "exp_avg_sq", p);
      const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(t));  // bias corrections
      const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(t));
      const double step_size = g.lr / bc1, inv_sqrt_bc2 = 1.0 / std::sqrt(bc2),
                   decay = decoupled_ ? 1.0 - g.lr * g.weight_decay : 1.0;
      if (p.dtype() == DType::f32) {
        const detail::AdamConsts k{static_cast<float>(o_.beta1), static_cast<float>(o_.beta2), static_cast<float>(o_.eps),
                                   static_cast<float>(g.weight_decay), static_cast<float>(step_size),
                                   static_cast<float>(inv_sqrt_bc2), static_cast<float>(decay), !decoupled_,
                                   grad_scale()};
        if (!p.device().is_cpu()) {  // the device's multi-tensor pass (after the loop), its copy written in it
          void* copy = copy_buffer(name, p);
          device_work_.push_back({static_cast<float*>(p.device_data()), static_cast<const float*>(grad.device_data()),
                                  static_cast<float*>(m.device_data()), static_cast<float*>(v.device_data()), p.numel(), k,
                                  g.lr, dstep, copy});
          device_ = p.device().index;
          if (copy) published_.emplace_back(&name, p);
          return;
        }
        void* copy = copy_buffer(name, p);
        work_.push_back({ptr<float>(p), ptr<float>(grad), ptr<float>(m), ptr<float>(v), static_cast<char*>(copy), k});
        sizes_.push_back(p.numel());
        if (copy) published_.emplace_back(&name, p);
        return;
      }
      double *w = ptr<double>(p), *mm = ptr<double>(m), *vv = ptr<double>(v);
      const double* gr = ptr<double>(grad);
      const double b1 = o_.beta1, b2 = o_.beta2, eps = o_.eps, wd = g.weight_decay;
      const bool l2 = !decoupled_;
      const int64_t n = p.numel();
#pragma omp parallel for simd if (n > kGrain)
      for (int64_t i = 0; i < n; ++i) {
        const double d = l2 ? gr[i] + wd * w[i] : gr[i];  // Adam: L2 in the gradient; AdamW: decay the weight
        mm[i] = b1 * mm[i] + (1.0 - b1) * d;
        vv[i] = b2 * vv[i] + (1.0 - b2) * d * d;
        w[i] = w[i] * decay - step_size * mm[i] / (std::sqrt(vv[i]) * inv_sqrt_bc2 + eps);
      }
    });
    const DType cd = low_precision_copies();
    const int64_t csize = static_cast<int64_t>(dtype_size(cd));
    over_all_chunks(sizes_, [&](int k, int64_t begin, int64_t end) {
      const WorkF32& w = work_[k];
      detail::adam_f32(w.w + begin, w.g + begin, w.m + begin, w.v + begin, end - begin, w.k,
                       w.copy ? w.copy + begin * csize : nullptr, cd);
    });
    if (!device_work_.empty()) {
      const detail::DeviceStepGuard guard{guard_skip(), guard_grad_scale()};
      detail::adam_on_device(device_, device_work_, cd, guard.skip ? &guard : nullptr, o_.beta1, o_.beta2);
      advance_device_steps(device_);
    }
    for (const auto& [name, p] : published_) publish_copy(*name, p);
    refresh_packed_weights();
    ++steps_;
  }

 private:
  bool writes_copies_in_pass() const override { return true; }
  bool folds_grad_scale() const override { return true; }
  bool steps_on_cuda() const override { return true; }
  struct WorkF32 {
    float* w;
    const float* g;
    float *m, *v;
    char* copy;  // low-precision copy, or null
    detail::AdamConsts k;
  };
  AdamOptions o_;
  bool decoupled_;
  std::vector<WorkF32> work_;  // per-step scratch, capacity reused
  std::vector<int64_t> sizes_;
  std::vector<std::pair<const std::string*, Tensor>> published_;
  std::vector<detail::AdamDeviceWork> device_work_;  // parameters on a CUDA device (one device)
  int device_ = 0;
};

class LAMB final : public Optimizer {
 public:
  LAMB(std::vector<ParamGroup> g, LambOptions o) : Optimizer(std::move(g)), o_(o) {}
  std::string name() const override { return "lamb"; }
  void step() override {
    for_each_param([&](ParamGroup& g, const std::string& name, Tensor& p, const Tensor& grad) {
      const int64_t t = ++param_step(name);
      Tensor m = state(name, "exp_avg", p), v = state(name, "exp_avg_sq", p);
      Tensor upd = zeros(p.sizes(), TensorOptions(p.dtype()).with_tag(MemTag::workspace));
      by_dtype(p, [&]<class T>() {
        T* w = ptr<T>(p);
        const T* gr = ptr<T>(grad);
        T *mm = ptr<T>(m), *vv = ptr<T>(v), *u = ptr<T>(upd);
        const T b1 = o_.beta1, b2 = o_.beta2, eps = o_.eps, wd = g.weight_decay;
        const T bc1 = static_cast<T>(1.0 - std::pow(o_.beta1, double(t))), bc2 = static_cast<T>(1.0 - std::pow(o_.beta2, double(t)));
        const int64_t n = p.numel();
#pragma omp parallel for if (n > kGrain)
        for (int64_t i = 0; i < n; ++i) {
          mm[i] = b1 * mm[i] + (T(1) - b1) * gr[i];
          vv[i] = b2 * vv[i] + (T(1) - b2) * gr[i] * gr[i];
          u[i] = (mm[i] / bc1) / (std::sqrt(vv[i] / bc2) + eps) + wd * w[i];  // Adam direction + decoupled decay
        }
        // Layer-wise trust ratio ||w|| / ||update|| (1 where either norm is 0).
        const double wn = std::sqrt(sq_norm(w, n)), un = std::sqrt(sq_norm(u, n));
        const T trust = (wn > 0 && un > 0) ? static_cast<T>(wn / un) : T(1);
        const T scale = static_cast<T>(g.lr) * trust;
#pragma omp parallel for simd if (n > kGrain)
        for (int64_t i = 0; i < n; ++i) w[i] -= scale * u[i];
      });
    });
    refresh_packed_weights();
    ++steps_;
  }
 private:
  LambOptions o_;
};

class LARS final : public Optimizer {
 public:
  LARS(std::vector<ParamGroup> g, LarsOptions o) : Optimizer(std::move(g)), o_(o) {}
  std::string name() const override { return "lars"; }
  void step() override {
    for_each_param([&](ParamGroup& g, const std::string& name, Tensor& p, const Tensor& grad) {
      ++param_step(name);
      Tensor buf = state(name, "momentum_buffer", p);
      by_dtype(p, [&]<class T>() {
        T* w = ptr<T>(p);
        const T* gr = ptr<T>(grad);
        T* b = ptr<T>(buf);
        const int64_t n = p.numel();
        // Local lr = eta * ||w|| / (||g|| + wd ||w||): each layer moves by a fixed fraction of its norm.
        const double wn = std::sqrt(sq_norm(w, n)), gn = std::sqrt(sq_norm(gr, n));
        const double local = (wn > 0 && gn > 0) ? o_.trust_coefficient * wn / (gn + g.weight_decay * wn + o_.eps) : 1.0;
        const T scaled = static_cast<T>(local * g.lr), wd = g.weight_decay, mom = o_.momentum;
#pragma omp parallel for simd if (n > kGrain)
        for (int64_t i = 0; i < n; ++i) {
          b[i] = mom * b[i] + scaled * (gr[i] + wd * w[i]);
          w[i] -= b[i];
        }
      });
    });
    refresh_packed_weights();
    ++steps_;
  }
 private:
  LarsOptions o_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(std::vector<ParamGroup> g, SgdOptions o) {
  ATH_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "sgd", "nesterov needs momentum > 0 and dampening = 0");
  return std::make_unique<SGD>(std::move(g), o);
}
std::unique_ptr<Optimizer> make_rmsprop(std::vector<ParamGroup> g, RmspropOptions o) { return std::make_unique<RMSprop>(std::move(g), o); }
std::unique_ptr<Optimizer> make_adam(std::vector<ParamGroup> g, AdamOptions o) { return std::make_unique<Adam>(std::move(g), o, false); }
std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> g, AdamOptions o) { return std::make_unique<Adam>(std::move(g), o, true); }
std::unique_ptr<Optimizer> make_lamb(std::vector<ParamGroup> g, LambOptions o) { return std::make_unique<LAMB>(std::move(g), o); }
std::unique_ptr<Optimizer> make_lars(std::vector<ParamGroup> g, LarsOptions o) { return std::make_unique<LARS>(std::move(g), o); }

}  // namespace athanor::optim
