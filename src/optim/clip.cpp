// Gradient norm and clipping. f32 gradients (the usual case) go through one
// multi-tensor pass (cpu::for_each_chunk, backend/cpu/stealing_runs.h): each fixed chunk's Σg² summed in f64 by the
// AVX-512 kernel, the per-chunk sums added in chunk order, so the norm does not
// depend on the thread count. Other dtypes (f64, bf16, f16 gradients) take a
// per-tensor loop. Gradients on a CUDA device: the norm from the device's multi-tensor
// sum of squares (f64, fixed order; one read-back of the one double, since the norm is
// returned), the scaling on the device (optim/device_update.h).
#include "athanor/optim/clip.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "optim/device_update.h"
#include "optim/fused_update.h"
#include "backend/cpu/stealing_runs.h"

namespace athanor::optim {
namespace {

constexpr int64_t kChunk = 1 << 14, kGrain = 1 << 14;

struct Span {
  float* data;
  int64_t n;
};

// The f32 gradients as spans; calls other(g) for every other floating gradient.
template <class Other> std::vector<Span> f32_grads(const std::vector<Tensor>& params, const char* op, const Other& other) {
  std::vector<Span> spans;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    ATH_CHECK(g.is_contiguous(), op, "gradient of ", p.describe(), " is not contiguous",
              Hint{"gradients are made contiguous by backward; do not replace .grad with a strided view"});
    if (g.dtype() == DType::f32) spans.push_back({static_cast<float*>(g.raw_data()), g.numel()});
    else other(g);
  }
  return spans;
}

std::vector<int64_t> sizes_of(const std::vector<Span>& spans) {
  std::vector<int64_t> sizes;
  for (const Span& s : spans) sizes.push_back(s.n);
  return sizes;
}

// body(span, begin, end, chunk index) over every chunk of every span (cpu::for_each_chunk, backend/cpu/stealing_runs.h).
template <class Body> void over_chunks(const std::vector<Span>& spans, const Body& body) {
  const std::vector<int64_t> sizes = sizes_of(spans);
  int64_t total = 0;
  for (const int64_t n : sizes) total += n;
  cpu::for_each_chunk(sizes, kChunk, total > kGrain, body);
}

double sum_squares_other(const Tensor& g) {
  double s = 0;
  dispatch(g.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      const T* d = static_cast<const T*>(g.raw_data());
      for (int64_t i = 0; i < g.numel(); ++i) {
        const double v = cast_value<double>(d[i]);
        s += v * v;
      }
    }
  });
  return s;
}

void scale_other(const Tensor& g, double coef) {
  dispatch(g.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      T* d = static_cast<T*>(g.raw_data());
      const int64_t n = g.numel();
#pragma omp parallel for if (n > kGrain)
      for (int64_t i = 0; i < n; ++i) d[i] = cast_value<T>(cast_value<double>(d[i]) * coef);
    }
  });
}

// The gradients when they live on a CUDA device (all of them on one, f32); nullopt when they
// are on the CPU. Mixed devices and other dtypes on the device are errors before any work.
struct DeviceGrads {
  int device = 0;
  std::vector<float*> data;
  std::vector<int64_t> sizes;
};
std::optional<DeviceGrads> device_grads(const std::vector<Tensor>& params, const char* op) {
  std::optional<DeviceGrads> out;
  bool any_cpu = false;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.device().is_cpu()) {
      any_cpu = true;
      continue;
    }
    if (!out) out = DeviceGrads{g.device().index, {}, {}};
    ATH_CHECK(g.device().index == out->device, op, "gradients on ", Device::cuda(out->device).str(), " and on ",
              g.device().str(), Hint{"keep every parameter of one optimizer on one device"});
    ATH_CHECK(g.dtype() == DType::f32 && g.is_contiguous(), op, "not yet supported on cuda: the gradient of ",
              p.describe(), " is ", g.describe(), " (f32 contiguous gradients only)");
    out->data.push_back(static_cast<float*>(g.device_data())), out->sizes.push_back(g.numel());
  }
  ATH_CHECK(!(out && any_cpu), op, "some gradients are on the CPU and some on ", Device::cuda(out ? out->device : 0).str(),
            Hint{"move the whole model to one device (module.to(device)) before training"});
  return out;
}

double device_sum_squares(const DeviceGrads& d) {
  return detail::sum_squares_on_device(d.device, std::vector<const float*>(d.data.begin(), d.data.end()), d.sizes);
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  if (const auto d = device_grads(params, "grad_norm")) return std::sqrt(device_sum_squares(*d));
  double total = 0;
  const std::vector<Span> spans = f32_grads(params, "grad_norm", [&](const Tensor& g) { total += sum_squares_other(g); });
  std::vector<double> partial(cpu::num_chunks(sizes_of(spans), kChunk));
  over_chunks(spans, [&](int k, int64_t b, int64_t e, int64_t c) { partial[c] = detail::sum_squares_f32(spans[k].data + b, e - b); });
  for (const double s : partial) total += s;
  return std::sqrt(total);
}

Tensor grad_sum_squares_on_device(const std::vector<Tensor>& params) {
  const auto d = device_grads(params, "grad_norm");
  ATH_CHECK(d.has_value(), "grad_norm", "no gradient on a CUDA device",
            Hint{"grad_sum_squares_on_device is the device form of grad_norm; use grad_norm for CPU gradients"});
  std::vector<const float*> data(d->data.begin(), d->data.end());
  return detail::sum_squares_tensor_on_device(d->device, data, d->sizes);
}

double clip_coefficient(double norm, double max_norm) {
  if (!std::isfinite(norm)) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  ATH_CHECK(max_norm > 0, "clip_grad_norm", "max_norm must be > 0, got ", max_norm);
  const std::optional<DeviceGrads> dev = device_grads(params, "clip_grad_norm");
  const double norm = dev ? std::sqrt(device_sum_squares(*dev)) : grad_norm(params);
  if (!std::isfinite(norm)) return norm;  // leave the gradients alone; the caller reports/skips
  const double coef = clip_coefficient(norm, max_norm);
  if (coef >= 1.0) return norm;
  if (dev) {
    detail::scale_on_device(dev->device, dev->data, dev->sizes, coef);
    for (const Tensor& p : params)
      if (p.grad().defined()) p.grad().bump_version();
    return norm;
  }
  const std::vector<Span> spans = f32_grads(params, "clip_grad_norm", [&](const Tensor& g) { scale_other(g, coef); });
  over_chunks(spans, [&](int k, int64_t b, int64_t e, int64_t) { detail::scale_f32(spans[k].data + b, e - b, coef); });
  for (const Tensor& p : params)
    if (p.grad().defined()) p.grad().bump_version();
  return norm;
}

void clip_grad_value(const std::vector<Tensor>& params, double clip) {
  ATH_CHECK(clip > 0, "clip_grad_value", "clip must be > 0, got ", clip);
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    ATH_CHECK(g.device().is_cpu(), "clip_grad_value", "not yet supported on cuda: clipping by value the gradient of '", p.name(),
              "' on ", g.device().str(), Hint{"clip by norm (optimizer.grad_clip / clip_grad_norm), which runs on the device"});
    dispatch(g.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        T* d = static_cast<T*>(g.raw_data());
        for (int64_t i = 0; i < g.numel(); ++i) d[i] = cast_value<T>(std::clamp(cast_value<double>(d[i]), -clip, clip));
      }
    });
    g.bump_version();
  }
}

namespace detail {
void scale_gradient(const Tensor& g, double coef) {
  if (g.dtype() == DType::f32) {
    const std::vector<Span> one{{static_cast<float*>(g.raw_data()), g.numel()}};
    over_chunks(one, [&](int, int64_t b, int64_t e, int64_t) { scale_f32(one[0].data + b, e - b, coef); });
  } else {
    scale_other(g, coef);
  }
}
}  // namespace detail

}  // namespace athanor::optim
