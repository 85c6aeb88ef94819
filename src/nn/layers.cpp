// Standard layers: thin modules over the functional ops, with PyTorch's default
// initialisation (drawn from athanor's counter-based default generator).
#include "athanor/nn/layers.h"

#include <cmath>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/rng.h"
#include "athanor/ops.h"

namespace athanor::nn {
namespace {
Tensor uniform_init(const Shape& shape, double bound) {
  Tensor t = empty(shape, TensorOptions().with_tag(MemTag::parameter));
  uniform_(t, -bound, bound);
  return t;
}
void check_positive(int64_t v, const char* layer, const char* what) {
  ATH_CHECK(v > 0, layer, what, " must be > 0, got ", v);
}
}  // namespace

Linear::Linear(int64_t in, int64_t out, bool has_bias) {
  check_positive(in, "Linear", "in_features");
  check_positive(out, "Linear", "out_features");
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));  // kaiming_uniform(a=sqrt(5)) == U(±1/sqrt(in))
  weight = register_parameter("weight", uniform_init({out, in}, bound));
  if (has_bias) bias = register_parameter("bias", uniform_init({out}, bound));
}
Tensor Linear::forward(const Tensor& x) {
  auto scope = enter();
  return linear(x, weight, bias);
}

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> pad) : padding_idx(pad) {
  check_positive(num, "Embedding", "num_embeddings");
  check_positive(dim, "Embedding", "embedding_dim");
  if (pad) ATH_CHECK(*pad >= 0 && *pad < num, "Embedding", "padding_idx ", *pad, " is outside [0, ", num, ")");
  Tensor w = empty({num, dim}, TensorOptions().with_tag(MemTag::parameter));
  normal_(w, 0.0, 1.0);
  if (pad) make_view(w, {dim}, {1}, *pad * dim).fill_(0.0);
  weight = register_parameter("weight", w);
}
Tensor Embedding::forward(const Tensor& ids) {
  auto scope = enter();
  return embedding(weight, ids, padding_idx);
}

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine, bool has_bias) : normalized_shape(std::move(shape)), eps(eps_) {
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape, TensorOptions().with_tag(MemTag::parameter)));
    if (has_bias) bias = register_parameter("bias", zeros(normalized_shape, TensorOptions().with_tag(MemTag::parameter)));
  }
}
Tensor LayerNorm::forward(const Tensor& x) {
  auto scope = enter();
  return layer_norm(x, normalized_shape, weight, bias, eps);
}

RMSNorm::RMSNorm(Shape shape, double eps_) : normalized_shape(std::move(shape)), eps(eps_) {
  weight = register_parameter("weight", ones(normalized_shape, TensorOptions().with_tag(MemTag::parameter)));
}
Tensor RMSNorm::forward(const Tensor& x) {
  auto scope = enter();
  return rms_norm(x, normalized_shape, weight, eps);
}

BatchNorm::BatchNorm(int64_t c, int64_t dims, double eps_, double momentum_) : expected_dims(dims), eps(eps_), momentum(momentum_) {
  check_positive(c, "BatchNorm", "num_features");
  weight = register_parameter("weight", ones({c}, TensorOptions().with_tag(MemTag::parameter)));
  bias = register_parameter("bias", zeros({c}, TensorOptions().with_tag(MemTag::parameter)));
  running_mean = register_buffer("running_mean", zeros({c}, TensorOptions().with_tag(MemTag::parameter)));
  running_var = register_buffer("running_var", ones({c}, TensorOptions().with_tag(MemTag::parameter)));
  num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, TensorOptions(DType::i64).with_tag(MemTag::parameter)));
}
Tensor BatchNorm::forward(const Tensor& x) {
  auto scope = enter();
  const char* op = expected_dims == 2 ? "BatchNorm1d" : "BatchNorm2d";
  if (expected_dims == 2) {
    ATH_CHECK(x.dim() == 2 || x.dim() == 3, op, "expected a 2-D [N, C] or 3-D [N, C, L] input, got ", x.describe());
  } else {
    ATH_CHECK(x.dim() == 4, op, "expected a 4-D [N, C, H, W] input, got ", x.describe());
  }
  ATH_CHECK(x.size(1) == weight.size(0), op, "input has ", x.size(1), " channels (dim 1) but the layer has ", weight.size(0),
            "; input ", x.describe(), Hint{"the layer's num_features must equal the channel count (dim 1) of its input"});
  if (is_training()) {
    // Counted on the host: reading the device buffer each forward would stall the step.
    if (tracked_impl_ != num_batches_tracked.impl() || tracked_version_ != num_batches_tracked.version())
      tracked_ = num_batches_tracked.item<int64_t>();
    num_batches_tracked.fill_(static_cast<double>(++tracked_));
    tracked_impl_ = num_batches_tracked.impl();
    tracked_version_ = num_batches_tracked.version();
  }
  if (is_training() && reduce_stats_) return forward_reduced_stats(x);
  return batch_norm(x, running_mean, running_var, weight, bias, is_training(), momentum, eps);
}

// Built from differentiable ops plus the differentiable reducer, so the backward
// is the chain rule of the same graph (input, weight and bias gradients).
Tensor BatchNorm::forward_reduced_stats(const Tensor& x) {
  const int64_t C = weight.size(0);
  std::vector<int64_t> dims{0};  // every dim but the channels
  Shape bshape(x.dim(), 1);      // [1, C, 1, …] for broadcasting per-channel values
  bshape[1] = C;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  // Positions per channel over all processes (each may have its own batch size).
  const Tensor count = reduce_stats_(
      from_vector(std::vector<double>{static_cast<double>(x.numel() / C)}, {1}, TensorOptions(DType::f64)));
  ATH_CHECK(count.defined() && count.numel() == 1, "BatchNorm", "the batch statistics reducer returned ",
            count.defined() ? count.describe() : std::string("nothing"), " for a [1] count",
            Hint{"a reducer must return a tensor of its input's shape (the sum over processes)"});
  const double M = count.item();
  ATH_CHECK(M > 1, "BatchNorm", "needs more than one value per channel over all processes, got ", M, " for input ",
            x.describe(), Hint{"use a larger batch, or keep batch statistics local"});

  Tensor mean = div(reduce_stats_(sum(x, dims)), M);  // [C]
  Tensor centred = sub(x, mean.reshape(bshape));
  Tensor var = div(reduce_stats_(sum(square(centred), dims)), M);  // biased, [C]
  Tensor y = mul(centred, rsqrt(add(var, eps)).reshape(bshape));
  y = add(mul(y, weight.reshape(bshape)), bias.reshape(bshape));

  NoGradGuard ng;  // running statistics as the local kernel: unbiased variance, momentum
  running_mean.copy_(add(mul(running_mean, 1.0 - momentum), mul(mean.detach(), momentum)));
  running_var.copy_(add(mul(running_var, 1.0 - momentum), mul(var.detach(), momentum * M / (M - 1))));
  return y;
}
std::shared_ptr<BatchNorm> BatchNorm1d(int64_t c, double eps, double m) { return std::make_shared<BatchNorm>(c, 2, eps, m); }
std::shared_ptr<BatchNorm> BatchNorm2d(int64_t c, double eps, double m) { return std::make_shared<BatchNorm>(c, 4, eps, m); }

Dropout::Dropout(double p_) : p(p_) {
  ATH_CHECK(p >= 0 && p < 1, "Dropout", "p must be in [0, 1), got ", p);
}
Tensor Dropout::forward(const Tensor& x) {
  auto scope = enter();
  return dropout(x, p, is_training());
}

Conv2d::Conv2d(int64_t in, int64_t out, std::array<int64_t, 2> k, std::array<int64_t, 2> stride_,
               std::array<int64_t, 2> padding_, std::array<int64_t, 2> dilation_, int64_t groups_, bool has_bias)
    : stride(stride_), padding(padding_), dilation(dilation_), groups(groups_) {
  check_positive(groups, "Conv2d", "groups");
  ATH_CHECK(in % groups == 0 && out % groups == 0, "Conv2d", "in_channels (", in, ") and out_channels (", out,
            ") must be divisible by groups (", groups, ")");
  const double fan_in = static_cast<double>(in / groups * k[0] * k[1]);
  const double bound = 1.0 / std::sqrt(fan_in);
  weight = register_parameter("weight", uniform_init({out, in / groups, k[0], k[1]}, bound));
  if (has_bias) bias = register_parameter("bias", uniform_init({out}, bound));
}
Tensor Conv2d::forward(const Tensor& x) {
  auto scope = enter();
  return conv2d(x, weight, bias, stride, padding, dilation, groups);
}

MaxPool2d::MaxPool2d(std::array<int64_t, 2> k, std::array<int64_t, 2> s, std::array<int64_t, 2> p)
    : kernel(k), stride(s), padding(p) {}
Tensor MaxPool2d::forward(const Tensor& x) {
  auto scope = enter();
  return max_pool2d(x, kernel, stride, padding);
}

Tensor Flatten::forward(const Tensor& x) { return flatten(x, 1); }
Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x, approx); }

std::shared_ptr<UnaryModule> make_activation(const std::string& name) {
  if (name == "relu") return std::make_shared<ReLU>();
  if (name == "tanh") return std::make_shared<Tanh>();
  if (name == "sigmoid") return std::make_shared<Sigmoid>();
  if (name == "silu") return std::make_shared<SiLU>();
  if (name == "gelu") return std::make_shared<GELU>(GeluApprox::none);
  if (name == "gelu_tanh") return std::make_shared<GELU>(GeluApprox::tanh);
  ATH_FAIL("activation", "unknown activation '", name, "'", Hint{"use one of relu, tanh, sigmoid, silu, gelu, gelu_tanh"});
}

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> layers) {
  for (auto& l : layers) push_back(std::move(l));
}
void Sequential::push_back(std::shared_ptr<UnaryModule> layer) {
  layers_.push_back(register_module(std::to_string(layers_.size()), std::move(layer)));
}
Tensor Sequential::forward(const Tensor& x) {
  auto scope = enter();
  Tensor h = x;
  for (auto& l : layers_) h = l->forward(h);
  return h;
}

}  // namespace athanor::nn
