// GradScaler: f16 gradients that underflow without scaling are recovered with
// it; an injected inf skips the step, names the parameter and halves the scale,
// which grows back after the growth interval; state_dict; misuse errors.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "athanor/core/device_hooks.h"
#include "athanor/ops/autocast.h"
#include "athanor/amp/grad_scaler.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

TEST(GradScaler, RecoversF16GradientsThatUnderflowWithoutScaling) {
  // loss = sum(1e-8 * x W^T), the product in f32. Under f16 autocast the linear
  // runs in f16, so its output gradient dL/dy = 1e-8 reaches it in f16, where anything below 2^-25
  // (~3e-8) rounds to zero: dW = dy^T x = 0. Scaled by 2^16, dy = 6.6e-4 is a
  // normal f16 and dW survives; unscaling in f32 gives the true gradient.
  Generator g(31);
  const Tensor x = randn({8, 16}, {}, g);
  Tensor w = random_leaf({4, 16}, 32);
  const Tensor tiny = full({8, 4}, 1e-8);  // an f32 tensor: mul promotes the f16 linear output to f32
  auto loss_fn = [&] { return sum(mul(linear(x, w, Tensor()), tiny), {}, false); };

  Tensor loss32 = loss_fn();
  loss32.backward();
  const Tensor ref = w.grad().clone();
  ASSERT_GT(std::abs(ref.to_vector()[0]), 1e-9);  // the f32 gradient is ~1e-8 * sum of 8 N(0,1), nonzero

  // Without scaling: every f16 gradient underflows to zero.
  w.set_grad(Tensor());
  Tensor loss;
  {
    autocast ac(DType::f16);
    loss = loss_fn();
  }
  loss.backward();
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  for (double v : w.grad().to_vector()) EXPECT_EQ(v, 0.0);

  // With the scaler: the same values as in f32, within f16 rounding.
  w.set_grad(Tensor());
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  {
    autocast ac(DType::f16);
    loss = loss_fn();
  }
  scaler.scale(loss).backward();
  const bool found_inf = scaler.unscale({{"w", w}});
  EXPECT_FALSE(found_inf);
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  // dy = 2^16 * 1e-8 rounded to f16 (rel 2^-11), x rounded to f16 (rel 2^-11),
  // dW rounded to f16 once: relative error <= ~3 * 2^-11 = 1.5e-3; rtol 5e-3.
  EXPECT_CLOSE(w.grad(), ref, 1e-12, 5e-3);
  scaler.update(found_inf);
  EXPECT_FALSE(scaler.last_step_skipped());
}

TEST(GradScaler, InfSkipsStepNamesParameterHalvesScaleAndGrowsBack) {
  GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  GradScaler scaler(o);
  Tensor a = random_leaf({3}, 41), b = random_leaf({2, 2}, 42);
  const GradScaler::NamedTensors params = {{"layer.a", a}, {"layer.b", b}};
  auto step = [&](bool inject_inf) {
    a.set_grad(Tensor()), b.set_grad(Tensor());
    Tensor loss = add(sum(mul(a, a), {}, false), sum(mul(b, 3.0), {}, false));
    scaler.scale(loss).backward();
    if (inject_inf) b.grad().data_ptr<float>()[1] = std::numeric_limits<float>::infinity();
    const bool found_inf = scaler.unscale(params);
    scaler.update(found_inf);
    return found_inf;
  };

  EXPECT_FALSE(step(false));
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
  // Unscaled gradient equals the true one: d/db sum(3b) = 3.
  for (double v : b.grad().to_vector()) EXPECT_DOUBLE_EQ(v, 3.0);

  EXPECT_TRUE(step(true));
  EXPECT_TRUE(scaler.last_step_skipped());
  EXPECT_EQ(scaler.nonfinite_params(), std::vector<std::string>{"layer.b"});
  EXPECT_FALSE(scaler.loss_nonfinite());
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(scaler.skipped_steps(), 1);

  // growth_interval (3) clean steps later the scale doubles back.
  EXPECT_FALSE(step(false));
  EXPECT_FALSE(step(false));
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_FALSE(step(false));
  EXPECT_FALSE(scaler.last_step_skipped());
  EXPECT_TRUE(scaler.nonfinite_params().empty());
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, RecordsNonFiniteLoss) {
  GradScaler scaler;
  Tensor p = random_leaf({2}, 43);
  Tensor loss = sum(mul(p, std::numeric_limits<double>::infinity()), {}, false);
  scaler.scale(loss).backward();
  EXPECT_TRUE(scaler.loss_nonfinite());
  EXPECT_TRUE(scaler.unscale(std::vector<Tensor>{p}));
  EXPECT_EQ(scaler.nonfinite_params().size(), 1u);
  scaler.update(true);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

namespace {
// "cuda" tensors in host memory, for the scaler's host reads of a device loss: only what
// allocation, fill_ and the copies to and from the host need (the scaler's kernels are not
// reached: the scaler below is disabled, so scale() multiplies by nothing).
struct HostMemoryCudaHooks final : DeviceHooks {
  int downloads = 0;
  void check_device(int index, const char* op) override {
    if (index != 0) ATH_FAIL(op, "the fake has cuda:0 only");
  }
  void* allocate(int, std::size_t nbytes, MemTag) override { return std::malloc(std::max<std::size_t>(nbytes, 1)); }
  void deallocate(int, void* p) override { std::free(p); }
  void retag(int, void*, MemTag) override {}
  void copy_to_device(void* dst, int, const void* src, std::size_t n) override { std::memcpy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, int, std::size_t n) override {
    ++downloads;
    std::memcpy(dst, src, n);
  }
  void copy_between(void* dst, int, const void* src, int, std::size_t n) override { std::memcpy(dst, src, n); }
  void copy_strided(const StridedRegion&, const StridedRegion&, int, const char* op) override {
    ATH_FAIL(op, "not in the fake");
  }
  void fill(const StridedRegion& r, double v, int) override {  // a 0-d f32 tensor is all the test fills
    ATH_CHECK(r.dtype == DType::f32 && r.sizes.empty(), "fill", "the fake fills 0-d f32 tensors only");
    *static_cast<float*>(r.data) = static_cast<float>(v);
  }
  void add_into(void*, const void*, DType, int64_t, int, const char* op) override {
    ATH_FAIL(op, "not in the fake");
  }
};
struct CudaHooksScope {
  DeviceHooks* saved = device_hooks(DeviceType::cuda);
  explicit CudaHooksScope(DeviceHooks* h) { set_device_hooks(DeviceType::cuda, h); }
  ~CudaHooksScope() { set_device_hooks(DeviceType::cuda, saved); }
};
}  // namespace

// scale() keeps a device loss for loss_nonfinite() to check when asked; the check reads a host
// copy of it (it once read the device pointer as host memory: "data_ptr: host code asked for
// the data of tensor [] f32, which lives on cuda:0", tests/gpu/test_gpu_amp.cpp's first read).
TEST(GradScaler, ChecksADeviceLossThroughAHostCopy) {
  HostMemoryCudaHooks fake;
  const CudaHooksScope scope(&fake);
  GradScalerOptions o;
  o.enabled = false;
  for (double v : {1.5, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    SCOPED_TRACE(v);
    GradScaler s(o);
    const Tensor loss = full({}, v, TensorOptions(DType::f32).with_device(Device::cuda(0)));
    const Tensor scaled = s.scale(loss);
    EXPECT_EQ(scaled.device(), Device::cuda(0));
    const int before = fake.downloads;
    EXPECT_EQ(s.loss_nonfinite(), !std::isfinite(v));
    EXPECT_EQ(fake.downloads, before + 1);  // read when asked, once
    EXPECT_EQ(s.loss_nonfinite(), !std::isfinite(v));
    EXPECT_EQ(fake.downloads, before + 1);  // and kept
  }
}

TEST(GradScaler, StateDictRoundTripAndMisuse) {
  GradScalerOptions o;
  o.growth_interval = 10;
  GradScaler s1(o);
  s1.update(true);
  s1.update(false), s1.update(false);
  GradScaler s2(o);
  s2.load_state_dict(s1.state_dict());
  EXPECT_EQ(s2.get_scale(), 32768.0);
  EXPECT_EQ(s2.growth_tracker(), 2);
  EXPECT_FALSE(error_message([&] { s2.load_state_dict({{"scale", scalar_tensor(1.0, DType::f64)}}); }).empty());

  Tensor p = random_leaf({2}, 44);
  sum(p, {}, false).backward();
  s2.unscale(std::vector<Tensor>{p});
  const std::string msg = error_message([&] { s2.unscale(std::vector<Tensor>{p}); });
  EXPECT_NE(msg.find("already called"), std::string::npos) << msg;

  // Disabled (bf16/f32 training): identity scale, but non-finite gradients are still reported.
  GradScalerOptions off;
  off.enabled = false;
  GradScaler s3(off);
  Tensor q = random_leaf({2}, 45);
  Tensor l = sum(q, {}, false);
  EXPECT_TRUE(s3.scale(l).is_same(l));
  l.backward();
  q.grad().data_ptr<float>()[0] = std::nanf("");
  EXPECT_TRUE(s3.unscale({{"q", q}}));
  s3.update(true);
  EXPECT_EQ(s3.get_scale(), 1.0);
  EXPECT_TRUE(s3.last_step_skipped());
}


// The no-sync forms the CUDA path uses (unscale_async, update(found_inf tensor)) on CPU
// gradients: the same unscaling, flag, names and scale sequence as the bool forms.
TEST(GradScaler, AsyncFormsMatchTheBoolFormsOnCpuGradients) {
  GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 2;
  GradScaler a_sc(o), b_sc(o);
  Tensor a1 = random_leaf({3}, 51), a2 = random_leaf({3}, 51);
  const GradScaler::NamedTensors pa = {{"w", a1}}, pb = {{"w", a2}};
  for (bool inject : {false, true, false, false}) {
    for (Tensor* t : {&a1, &a2}) {
      t->set_grad(Tensor());
      a_sc.scale(sum(mul(*t, *t), {}, false)).backward();  // same scale on both (checked below)
      if (inject) t->grad().data_ptr<float>()[0] = std::numeric_limits<float>::infinity();
    }
    const bool fa = a_sc.unscale(pa);
    const Tensor fb = b_sc.unscale_async(pb);
    EXPECT_EQ(fb.device(), Device::cpu());
    EXPECT_EQ(fb.dim(), 0);
    EXPECT_EQ(fb.item<double>() != 0.0, fa);
    EXPECT_EQ(fa, inject);
    EXPECT_EQ(b_sc.nonfinite_params(), a_sc.nonfinite_params());
    for (std::size_t i = 1; i < 3; ++i) EXPECT_EQ(a1.grad().to_vector()[i], a2.grad().to_vector()[i]);
    a_sc.update(fa);
    b_sc.update(fb);
    EXPECT_EQ(b_sc.get_scale(), a_sc.get_scale());
    EXPECT_EQ(b_sc.growth_tracker(), a_sc.growth_tracker());
    EXPECT_EQ(b_sc.last_step_skipped(), a_sc.last_step_skipped());
    EXPECT_EQ(b_sc.skipped_steps(), a_sc.skipped_steps());
  }
  EXPECT_EQ(a_sc.get_scale(), 1024.0);  // halved once, grown back after two clean steps
  EXPECT_THROW(b_sc.update(zeros({2})), Error);  // found_inf is one element
}

}  // namespace athanor
