// device_update.h: the CUDA calls behind the optimizers' device step.
#include "optim/device_update.h"

#include "athanor/core/error.h"
#if ATHANOR_HAS_CUDA
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
// body(first, last) over the runs [first, last) of equal constants.
template <class W, class Body> void over_runs(const std::vector<W>& work, const Body& body) {
  for (std::size_t i = 0; i < work.size();) {
    std::size_t j = i + 1;
    while (j < work.size() && same(work[j].k, work[i].k)) ++j;
    body(i, j);
    i = j;
  }
}
}  // namespace

void adam_on_device(int device, const std::vector<AdamDeviceWork>& work) {
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::compute_stream(device);
  over_runs(work, [&](std::size_t a, std::size_t b) {
    std::vector<float*> w, m, v;
    std::vector<const float*> g;
    std::vector<int64_t> n;
    for (std::size_t i = a; i < b; ++i)
      w.push_back(work[i].w), g.push_back(work[i].g), m.push_back(work[i].m), v.push_back(work[i].v), n.push_back(work[i].n);
    const cpu::AdamConsts& k = work[a].k;
    const cuda::AdamArgs args{k.beta1, k.beta2, k.eps, k.wd, k.step_size, k.inv_sqrt_bc2, k.decay, k.l2, k.grad_scale};
    cuda::adam_multi_tensor(w.data(), g.data(), m.data(), v.data(), n.data(), static_cast<int>(n.size()), args, s);
  });
}

void sgd_on_device(int device, const std::vector<SgdDeviceWork>& work) {
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::compute_stream(device);
  over_runs(work, [&](std::size_t a, std::size_t b) {
    std::vector<float*> w, buf;
    std::vector<const float*> g;
    std::vector<int64_t> n;
    bool momentum = false;
    for (std::size_t i = a; i < b; ++i) {
      w.push_back(work[i].w), g.push_back(work[i].g), buf.push_back(work[i].b), n.push_back(work[i].n);
      momentum = momentum || work[i].b;
    }
    const cpu::SgdConsts& k = work[a].k;
    const cuda::SgdArgs args{k.lr, k.wd, k.momentum, k.one_minus_dampening, k.nesterov, k.first, k.grad_scale};
    cuda::sgd_multi_tensor(w.data(), g.data(), momentum ? buf.data() : nullptr, n.data(), static_cast<int>(n.size()), args, s);
  });
}

double sum_squares_on_device(int device, const std::vector<const float*>& grads, const std::vector<int64_t>& sizes) {
  if (grads.empty()) return 0.0;
  int64_t total = 0;
  for (const int64_t n : sizes) total += n;
  const Tensor acc = empty({1 + cuda::sum_squares_scratch(total)}, TensorOptions(DType::f64).with_device(Device::cuda(device)));
  double* base = static_cast<double*>(acc.device_data());
  cuda::DeviceGuard guard(device);
  cuda::sum_squares_multi_tensor(grads.data(), sizes.data(), static_cast<int>(grads.size()), base + 1, base,
                                 cuda::compute_stream(device));
  return make_view(acc, {1}, {1}, 0).cpu().to_vector()[0];  // the one sync: the norm is returned and logged
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
void adam_on_device(int, const std::vector<AdamDeviceWork>&) { no_cuda(); }
void sgd_on_device(int, const std::vector<SgdDeviceWork>&) { no_cuda(); }
double sum_squares_on_device(int, const std::vector<const float*>&, const std::vector<int64_t>&) { no_cuda(); }
void scale_on_device(int, const std::vector<float*>&, const std::vector<int64_t>&, double) { no_cuda(); }
#endif

}  // namespace athanor::optim::detail
