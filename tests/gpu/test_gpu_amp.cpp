// GradScaler on CUDA (src/amp/grad_scaler.cpp's device path, src/backend/cuda/amp.h) against
// the CPU scaler: the multi-tensor unscale gives the CPU's bits for f32, bf16 and f16
// gradients over more tensors than one launch takes, found_inf and the names of the
// non-finite gradients; the scale update on the device follows the CPU's sequence of scales,
// growth trackers and skipped steps; scale(loss) multiplies on the device.
#include <string>
#include <vector>

#include "athanor/amp/grad_scaler.h"
#include "athanor/core/tensor.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

// 40 parameters (two launches of the 32-tensor table), f32/bf16/f16 gradients of odd sizes;
// parameter 33's gradient holds an inf when `with_inf`.
GradScaler::NamedTensors make_params(Device d, bool with_inf) {
  GradScaler::NamedTensors out;
  const DType dts[3] = {DType::f32, DType::bf16, DType::f16};
  for (int i = 0; i < 40; ++i) {
    const int64_t n = 1 + (i * 997) % 3001;
    std::vector<float> v = random_vector(static_cast<std::size_t>(n), 100 + i, -4.0f, 4.0f);
    if (with_inf && i == 33) v[static_cast<std::size_t>(n / 2)] = INFINITY;
    Tensor p = zeros({n}, TensorOptions(dts[i % 3]).with_device(d));
    p.requires_grad_(true);
    p.set_grad(from_vector(v, {n}, TensorOptions(DType::f32)).to(dts[i % 3]).to(d));
    out.emplace_back("p." + std::to_string(i), p);
  }
  return out;
}

}  // namespace

TEST(GpuAmp, UnscaleMatchesTheCpuBitsAndNamesTheNonFiniteGradient) {
  ATH_REQUIRE_GPU();
  for (bool with_inf : {false, true}) {
    SCOPED_TRACE(with_inf ? "with an inf" : "all finite");
    GradScalerOptions o;
    o.init_scale = 1024.0;
    GradScaler sc(o), sg(o);
    auto pc = make_params(Device::cpu(), with_inf), pg = make_params(Device::cuda(0), with_inf);
    const bool fc = sc.unscale(pc);
    const Tensor fg = sg.unscale_async(pg);
    EXPECT_EQ(fg.device(), Device::cuda(0));
    EXPECT_EQ(fg.item<double>() != 0.0, fc);
    EXPECT_EQ(fc, with_inf);
    EXPECT_EQ(sg.nonfinite_params(), sc.nonfinite_params());
    for (std::size_t i = 0; i < pc.size(); ++i) {
      const std::vector<double> a = pc[i].second.grad().to_vector(), b = pg[i].second.grad().cpu().to_vector();
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t k = 0; k < a.size(); ++k)
        if (!(std::isinf(a[k]) && std::isinf(b[k]))) {
          ASSERT_EQ(a[k], b[k]) << pc[i].first << " element " << k;
        }
    }
  }
}

TEST(GpuAmp, ScaleUpdatesOnTheDeviceFollowTheCpu) {
  ATH_REQUIRE_GPU();
  GradScalerOptions o;
  o.init_scale = 256.0, o.growth_interval = 3, o.max_scale = 4096.0, o.min_scale = 64.0;
  GradScaler sc(o), sg(o);
  const Tensor loss = full({}, 1.5, TensorOptions(DType::f32).with_device(Device::cuda(0)));
  EXPECT_EQ(sg.scale(loss).item<double>(), 1.5 * 256.0);  // makes the device state
  // Growth, four backoffs (the last clamped at min_scale), then growth up to max_scale and past it.
  const bool seq[] = {false, false, false, true,  true,  true,  true,  false, false, false, false, false, false, false,
                      false, false, false, false, false, false, false, false, false, false, false, false, false, false};
  int step = 0;
  for (bool f : seq) {
    sc.update(f);
    sg.update(full({}, f ? 1.0 : 0.0, TensorOptions(DType::f32).with_device(Device::cuda(0))));
    if (++step % 4 == 0) {  // read back now and then, as a trainer's logged steps do
      EXPECT_EQ(sg.get_scale(), sc.get_scale()) << "step " << step;
      EXPECT_EQ(sg.growth_tracker(), sc.growth_tracker()) << "step " << step;
      EXPECT_EQ(sg.last_step_skipped(), sc.last_step_skipped()) << "step " << step;
    }
  }
  EXPECT_EQ(sg.get_scale(), sc.get_scale());
  EXPECT_EQ(sg.growth_tracker(), sc.growth_tracker());
  EXPECT_EQ(sg.skipped_steps(), sc.skipped_steps());
  EXPECT_EQ(sg.get_scale(), 4096.0);  // grew to the cap after the backoffs hit the floor
  EXPECT_EQ(sg.skipped_steps(), 4);
  // The state dict round-trips through the device copy.
  GradScaler sl(o);
  sl.scale(loss);
  sl.load_state_dict(sg.state_dict());
  EXPECT_EQ(sl.get_scale(), sg.get_scale());
  EXPECT_EQ(sl.scale(loss).item<double>(), 1.5 * 4096.0);
}
