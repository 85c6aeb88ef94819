// trainer.device: see trainer_device.h.
#include "train/trainer_device.h"

#include <string>
#include <vector>

#include "athanor/core/device_hooks.h"
#include "athanor/core/error.h"
#include "athanor/ops/registry.h"

namespace athanor {

Device parse_trainer_device(const std::string& v) {
  if (v == "cpu") return Device::cpu();
  if (v == "cuda") return Device::cuda(0);
  if (v.rfind("cuda:", 0) == 0 && v.size() > 5 && v.size() <= 8 && v.find_first_not_of("0123456789", 5) == std::string::npos)
    return Device::cuda(std::stoi(v.substr(5)));
  ATH_FAIL("config", "key 'trainer.device' is '", v, "', which is not a device",
           Hint{"use cpu, cuda (the first GPU) or cuda:N"});
}

namespace {
// The registry ops each model family's forward and loss call (src/nn/<model>.cpp).
std::vector<const char*> model_ops(const std::string& type) {
  if (type == "gpt")
    return {"embedding", "layer_norm", "linear", "gelu_linear", "causal_self_attention", "dropout", "add", "cross_entropy"};
  if (type == "mlp") return {"linear", "linear_relu", "relu", "cross_entropy"};
  if (type == "llama")
    return {"embedding", "rms_norm", "linear", "rope", "scaled_dot_product_attention", "swiglu", "add", "cross_entropy"};
  return {"conv2d", "batch_norm", "relu", "max_pool2d", "linear", "cross_entropy"};
}
}  // namespace

std::string cuda_training_gaps(const train::Config& c) {
  std::vector<std::string> gaps;
  std::string missing;
  for (const char* name : model_ops(c.get_string("model.type"))) {
    const OpDef* op = find_op(name);
    if (op && !op->has_kernel(DeviceType::cuda)) missing += std::string(missing.empty() ? "" : ", ") + name;
  }
  if (!missing.empty()) gaps.push_back("the " + c.get_string("model.type") + " ops without a CUDA kernel (" + missing + ")");
  const std::string opt = c.get_string("optimizer.type");
  if (opt != "adamw" && opt != "adam" && opt != "sgd")
    gaps.push_back("the " + opt + " optimizer's step (adamw, adam and sgd run on cuda)");
  if (c.get_float("optimizer.clip_value") > 0)
    gaps.push_back("optimizer.clip_value (clipping by value has no device pass; optimizer.grad_clip clips by norm on cuda)");
  // Data parallelism (DDP, ZeRO 1-3) runs on CUDA tensors, over NCCL or MPI with host staging
  // (dist.backend); tensor and pipeline parallelism do not yet (their layers' collectives and
  // the pipeline's transfers have not been run on CUDA tensors).
  if (c.get_int("dist.tp") > 1 || c.get_int("dist.pp") > 1)
    gaps.push_back("tensor and pipeline parallelism (dist.tp, dist.pp > 1; data parallelism and ZeRO 1-3 run on cuda)");
  std::string out;
  for (const std::string& g : gaps) out += (out.empty() ? "" : "; ") + g;
  return out;
}

void check_trainer_device(const train::Config& c) {
  const Device d = parse_trainer_device(c.get_string("trainer.device"));
  if (d.is_cpu()) return;
  require_device_hooks(d, "trainer.device");  // no CUDA in this build, no GPU, cuda:7: the first error
  const std::string gaps = cuda_training_gaps(c);
  if (gaps.empty()) return;
  ATH_FAIL("trainer.device", "not yet supported on cuda: training a ", c.get_string("model.type"), " on ", d.str(), ": ", gaps,
           Hint{"train with trainer.device: cpu; `athanor ops` lists the ops that run on cuda"});
}

}  // namespace athanor
