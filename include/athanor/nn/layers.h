#pragma once
// Standard layers. Every layer maps one tensor to one tensor (UnaryModule), so
// they compose in Sequential. Initialisation follows PyTorch's defaults unless
// noted; all random init draws from athanor's counter-based default generator.
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "athanor/nn/module.h"
#include "athanor/ops/activation.h"

namespace athanor::nn {

class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

class Linear : public UnaryModule {  // weight [out, in], U(-1/sqrt(in), 1/sqrt(in)); bias likewise
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

class Embedding : public UnaryModule {  // weight [num, dim], N(0, 1); the padding row zeroed
 public:
  Embedding(int64_t num_embeddings, int64_t dim, std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& ids) override;
  Tensor weight;
  std::optional<int64_t> padding_idx;
};

class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool affine = true, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  Shape normalized_shape;
  double eps;
};

class RMSNorm : public UnaryModule {
 public:
  explicit RMSNorm(Shape normalized_shape, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  Tensor weight;
  Shape normalized_shape;
  double eps;
};

// BatchNorm1d ([N,C] or [N,C,L]) and 2d ([N,C,H,W]).
//
// Training-mode statistics are those of this process's batch, unless a batch
// statistics reducer is installed (dist::convert_sync_batchnorm does, for data
// parallelism; nn knows nothing of process groups). The reducer sums a tensor
// over every process that shares the batch; with it, forward computes
//   mean = reduce(Σx) / M,  var = reduce(Σ(x − mean)²) / M   (M = reduce(count))
// per channel over the positions of all processes, two passes rather than
// E[x²] − mean² so the variance is as accurate as the local kernel's. Gradients
// flow back through the reducer, so they equal those of one process normalising
// the concatenated batch. Eval mode uses the running statistics, no reduction.
class BatchNorm : public UnaryModule {
 public:
  // Returns the element-wise sum of `t` over the processes; differentiable (its
  // backward sums the incoming gradients the same way). Every process must call
  // it with the same shapes, the same number of times, in the same order.
  using BatchStatsReducer = std::function<Tensor(const Tensor& t)>;

  BatchNorm(int64_t num_features, int64_t expected_dims, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // In place, so typed pointers to this layer, its names and its state dict stay as they are.
  void set_batch_stats_reducer(BatchStatsReducer reducer) { reduce_stats_ = std::move(reducer); }
  bool has_batch_stats_reducer() const { return static_cast<bool>(reduce_stats_); }

  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  int64_t expected_dims;
  double eps, momentum;

 private:
  Tensor forward_reduced_stats(const Tensor& x);  // training with reduce_stats_
  BatchStatsReducer reduce_stats_;
  // num_batches_tracked's value as this layer last wrote it, with the tensor and version it
  // wrote: a forward on a device counts with a fill (no host read) unless something else
  // wrote the buffer since (a checkpoint load, Module::to), which is read once.
  int64_t tracked_ = 0;
  const void* tracked_impl_ = nullptr;
  uint64_t tracked_version_ = 0;
};
std::shared_ptr<BatchNorm> BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
std::shared_ptr<BatchNorm> BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);

class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;
};

class Conv2d : public UnaryModule {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {1, 1},
         std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1,
         bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  std::array<int64_t, 2> stride, padding, dilation;
  int64_t groups;
};

class MaxPool2d : public UnaryModule {
 public:
  MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0}, std::array<int64_t, 2> padding = {0, 0});
  Tensor forward(const Tensor& x) override;
  std::array<int64_t, 2> kernel, stride, padding;
};

class Flatten : public UnaryModule {  // [N, ...] -> [N, prod(...)]
 public:
  Tensor forward(const Tensor& x) override;
};

// Activation modules.
class ReLU : public UnaryModule { public: Tensor forward(const Tensor& x) override; };
class Tanh : public UnaryModule { public: Tensor forward(const Tensor& x) override; };
class Sigmoid : public UnaryModule { public: Tensor forward(const Tensor& x) override; };
class SiLU : public UnaryModule { public: Tensor forward(const Tensor& x) override; };
class GELU : public UnaryModule {
 public:
  explicit GELU(GeluApprox approx = GeluApprox::none) : approx(approx) {}
  Tensor forward(const Tensor& x) override;
  GeluApprox approx;
};
// By name: "relu", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh" (Error listing the valid names otherwise).
std::shared_ptr<UnaryModule> make_activation(const std::string& name);

class Sequential : public UnaryModule {  // children named "0", "1", …
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> layers);
  void push_back(std::shared_ptr<UnaryModule> layer);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }
  std::shared_ptr<UnaryModule> operator[](size_t i) const { return layers_.at(i); }
 private:
  std::vector<std::shared_ptr<UnaryModule>> layers_;
};

}  // namespace athanor::nn
