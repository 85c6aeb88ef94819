// GradScaler's device half (grad_scaler_device.h).
#include "amp/grad_scaler_device.h"

#include "athanor/core/error.h"

#if defined(ATHANOR_HAS_CUDA)
#include "backend/cuda/amp.h"
#include "backend/cuda/runtime.h"
#endif

namespace athanor::detail {

#if defined(ATHANOR_HAS_CUDA)

void unscale_on_device(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf, const Tensor& flags) {
  if (grads.empty()) return;
  std::vector<void*> ptrs;
  std::vector<DType> dtypes;
  std::vector<int64_t> sizes;
  for (const Tensor& g : grads) {
    ATH_ASSERT(g.is_contiguous() && g.device() == found_inf.device());
    ptrs.push_back(g.device_data()), dtypes.push_back(g.dtype()), sizes.push_back(g.numel());
  }
  const int dev = found_inf.device().index;
  cuda::DeviceGuard guard(dev);
  cuda::unscale_multi_tensor(ptrs.data(), dtypes.data(), sizes.data(), static_cast<int>(ptrs.size()),
                             scale.defined() ? static_cast<const float*>(scale.device_data()) : nullptr,
                             static_cast<float*>(found_inf.device_data()), static_cast<int32_t*>(flags.device_data()),
                             cuda::compute_stream(dev));
}

void update_scale_on_device(const Tensor& scale, const Tensor& counters, const Tensor& found_inf, const GradScalerOptions& o) {
  cuda::ScaleUpdate u;
  u.growth_factor = o.growth_factor, u.backoff_factor = o.backoff_factor;
  u.min_scale = o.min_scale, u.max_scale = o.max_scale, u.growth_interval = o.growth_interval;
  const int dev = scale.device().index;
  cuda::DeviceGuard guard(dev);
  cuda::update_scale(static_cast<float*>(scale.device_data()), static_cast<double*>(counters.device_data()),
                     static_cast<const float*>(found_inf.device_data()), u, cuda::compute_stream(dev));
}

#else

void unscale_on_device(const std::vector<Tensor>&, const Tensor&, const Tensor&, const Tensor&) {
  ATH_FAIL("GradScaler.unscale", "this build has no CUDA", Hint{"rebuild with -DATHANOR_CUDA=ON"});
}
void update_scale_on_device(const Tensor&, const Tensor&, const Tensor&, const GradScalerOptions&) {
  ATH_FAIL("GradScaler.update", "this build has no CUDA", Hint{"rebuild with -DATHANOR_CUDA=ON"});
}

#endif

}  // namespace athanor::detail
