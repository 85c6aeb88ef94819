// device_update.h: the CUDA calls behind the optimizers' device step.
#include "optim/device_update.h"

#include "athanor/core/error.h"
#if ATHANOR_HAS_CUDA
#include "backend/cuda/amp.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#endif

namespace athanor::optim::detail {

#if ATHANOR_HAS_CUDA
namespace {
bool same(const cpu::AdamConsts& a, const cpu::AdamConsts& b) {
  return a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps && a.wd == b.wd && a.step_size == b.step_size &&
         a.inv_sqrt_bc2 == b.inv_sqrt_bc2 && a.decay == b.decay && a.l2 == b.l2 && a.grad_scale == b.grad_scale;
}
bool same(const cpu::SgdConsts& a, const cpu::SgdConsts& b) {
  return a.lr == b.lr && a.wd == b.wd && a.momentum == b.momentum && a.one_minus_dampening == b.one_minus_dampening &&
         a.nesterov == b.nesterov && a.first == b.first && a.grad_scale == b.grad_scale;
}
double lr_of(const AdamDeviceWork& w) { return w.lr; }
double lr_of(const SgdDeviceWork& w) { return w.k.lr; }
// body(first, last) over the runs [first, last) of equal constants.
template <class W, class Body> void over_runs(const std::vector<W>& work, const Body& body) {
  for (std::size_t i = 0; i < work.size();) {
    std::size_t j = i + 1;
    while (j < work.size() && same(work[j].k, work[i].k) && lr_of(work[j]) == lr_of(work[i])) ++j;
    body(i, j);
    i = j;
  }
}
}  // namespace

void adam_on_device(int device, const std::vector<AdamDeviceWork>& work, DType copy_dtype, const DeviceStepGuard* guard,
                    double beta1, double beta2) {
  cuda::DeviceGuard dg(device);
  const cudaStream_t s = cuda::compute_stream(device);
  over_runs(work, [&](std::size_t a, std::size_t b) {
    std::vector<float*> w, m, v;
    std::vector<const float*> g;
    std::vector<int64_t> n;
    std::vector<double*> steps;
    std::vector<void*> copies;
    bool any_copy = false;
    for (std::size_t i = a; i < b; ++i) {
      w.push_back(work[i].w), g.push_back(work[i].g), m.push_back(work[i].m), v.push_back(work[i].v), n.push_back(work[i].n);
      steps.push_back(work[i].step);
      copies.push_back(work[i].copy);
      any_copy = any_copy || work[i].copy;
    }
    const cpu::AdamConsts& k = work[a].k;
    const cuda::AdamArgs args{k.beta1, k.beta2, k.eps, k.wd, k.step_size, k.inv_sqrt_bc2, k.decay, k.l2, k.grad_scale};
    cuda::StepGuard sg;
    if (guard) sg = {guard->skip, guard->grad_scale, work[a].lr, beta1, beta2};
    cuda::adam_multi_tensor(w.data(), g.data(), m.data(), v.data(), n.data(), static_cast<int>(n.size()), args, s, sg,
                            guard ? steps.data() : nullptr,
                            cuda::WeightCopies{any_copy ? copies.data() : nullptr, copy_dtype});
  });
}

void sgd_on_device(int device, const std::vector<SgdDeviceWork>& work, DType copy_dtype, const DeviceStepGuard* guard) {
  cuda::DeviceGuard dg(device);
  const cudaStream_t s = cuda::compute_stream(device);
  over_runs(work, [&](std::size_t a, std::size_t b) {
    std::vector<float*> w, buf;
    std::vector<const float*> g;
    std::vector<int64_t> n;
    std::vector<double*> steps;
    std::vector<void*> copies;
    bool momentum = false, any_copy = false;
    for (std::size_t i = a; i < b; ++i) {
      w.push_back(work[i].w), g.push_back(work[i].g), buf.push_back(work[i].b), n.push_back(work[i].n);
      steps.push_back(work[i].step);
      copies.push_back(work[i].copy);
      momentum = momentum || work[i].b;
      any_copy = any_copy || work[i].copy;
    }
    const cpu::SgdConsts& k = work[a].k;
    const cuda::SgdArgs args{k.lr, k.wd, k.momentum, k.one_minus_dampening, k.nesterov, k.first, k.grad_scale};
    cuda::StepGuard sg;
    if (guard) sg = {guard->skip, guard->grad_scale, 0, 0, 0};
    cuda::sgd_multi_tensor(w.data(), g.data(), momentum ? buf.data() : nullptr, n.data(), static_cast<int>(n.size()), args, s,
                           sg, guard ? steps.data() : nullptr,
                           cuda::WeightCopies{any_copy ? copies.data() : nullptr, copy_dtype});
  });
}

bool device_copies_enabled() { return cuda::candidate_enabled(cuda::Candidate::lowp_copies); }

void narrow_on_device(const Tensor& p, const Tensor& copy) {
  ATH_ASSERT(!p.device().is_cpu() && copy.device() == p.device() && p.dtype() == DType::f32 && p.is_contiguous() &&
             copy.is_contiguous() && copy.sizes() == p.sizes());
  copy_into(copy, p);  // the device's cast (core's copy on the device: the cast op's own path)
}

void advance_steps_on_device(int device, const std::vector<double*>& steps, const float* skip) {
  if (steps.empty()) return;
  cuda::DeviceGuard dg(device);
  cuda::advance_steps(steps.data(), static_cast<int>(steps.size()), skip, cuda::compute_stream(device));
}

void step_guard_on_device(const Tensor& sumsq, const Tensor& found_inf, const Tensor& loss, double max_norm,
                          const Tensor& skip, const Tensor& out) {
  const int dev = skip.device().index;
  ATH_ASSERT(sumsq.dtype() == DType::f64 && skip.dtype() == DType::f32 && out.dtype() == DType::f64 && out.numel() == 3);
  ATH_ASSERT(!found_inf.defined() || (found_inf.dtype() == DType::f32 && found_inf.device() == skip.device()));
  ATH_ASSERT(!loss.defined() || (loss.dtype() == DType::f32 && loss.device() == skip.device() && loss.numel() == 1));
  cuda::DeviceGuard dg(dev);
  cuda::step_guard(static_cast<const double*>(sumsq.device_data()),
                   found_inf.defined() ? static_cast<const float*>(found_inf.device_data()) : nullptr,
                   loss.defined() ? static_cast<const float*>(loss.device_data()) : nullptr, max_norm,
                   static_cast<float*>(skip.device_data()), static_cast<double*>(out.device_data()),
                   cuda::compute_stream(dev));
}

double sum_squares_on_device(int device, const std::vector<const float*>& grads, const std::vector<int64_t>& sizes) {
  if (grads.empty()) return 0.0;
  return sum_squares_tensor_on_device(device, grads, sizes).cpu().to_vector()[0];  // the norm is returned and logged
}

Tensor sum_squares_tensor_on_device(int device, const std::vector<const float*>& grads, const std::vector<int64_t>& sizes) {
  if (grads.empty()) return zeros({1}, TensorOptions(DType::f64).with_device(Device::cuda(device)));
  int64_t total = 0;
  for (const int64_t n : sizes) total += n;
  const Tensor acc = empty({1 + cuda::sum_squares_scratch(total)}, TensorOptions(DType::f64).with_device(Device::cuda(device)));
  double* base = static_cast<double*>(acc.device_data());
  cuda::DeviceGuard guard(device);
  cuda::sum_squares_multi_tensor(grads.data(), sizes.data(), static_cast<int>(grads.size()), base + 1, base,
                                 cuda::compute_stream(device));
  return make_view(acc, {1}, {1}, 0);
}

void scale_on_device(int device, const std::vector<float*>& grads, const std::vector<int64_t>& sizes, double coef) {
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::compute_stream(device);
  for (std::size_t i = 0; i < grads.size(); ++i)
    cuda::scale(grads[i], static_cast<float>(coef), grads[i], sizes[i], s);
}
#else
namespace {
[[noreturn]] void no_cuda() {
  ATH_FAIL("optimizer", "a parameter on a CUDA device in a build without CUDA",
           Hint{"this is a bug: report it with the command that gave it"});
}
}  // namespace
void adam_on_device(int, const std::vector<AdamDeviceWork>&, DType, const DeviceStepGuard*, double, double) { no_cuda(); }
void sgd_on_device(int, const std::vector<SgdDeviceWork>&, DType, const DeviceStepGuard*) { no_cuda(); }
bool device_copies_enabled() { return false; }
void narrow_on_device(const Tensor&, const Tensor&) { no_cuda(); }
void advance_steps_on_device(int, const std::vector<double*>&, const float*) { no_cuda(); }
Tensor sum_squares_tensor_on_device(int, const std::vector<const float*>&, const std::vector<int64_t>&) { no_cuda(); }
void step_guard_on_device(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&) { no_cuda(); }
double sum_squares_on_device(int, const std::vector<const float*>&, const std::vector<int64_t>&) { no_cuda(); }
void scale_on_device(int, const std::vector<float*>&, const std::vector<int64_t>&, double) { no_cuda(); }
#endif

}  // namespace athanor::optim::detail
