#pragma once
#include <cstdint>
#include <optional>

#include "athanor/core/tensor.h"

namespace athanor {

// Llama 3.1's frequency scaling (Hugging Face config "rope_scaling": {"rope_type": "llama3", ...}):
// wavelengths longer than original_max_position / low_freq_factor are stretched by `factor`, those
// shorter than original_max_position / high_freq_factor are kept, and the band between is
// interpolated (HF's _compute_llama3_parameters).
struct RopeScaling {
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};
struct RopeOptions {
  double theta = 10000.0;  // HF "rope_theta"
  std::optional<RopeScaling> llama3;
  int64_t position_offset = 0;  // position of x's first token (generation with a KV cache)
};

// Rotary position embedding, Hugging Face's convention (rotate_half):
// x: [B, T, H, D] (D even; any strides whose last dim is contiguous is read in place) -> a new
// contiguous [B, T, H, D]. Element i < D/2 pairs with i + D/2 and both turn by the angle
// (position_offset + t) * inv_freq[i], inv_freq[i] = theta^(-2i/D) (Llama-3-scaled when llama3 is set):
//   out[i] = x[i] cos - x[i + D/2] sin,   out[i + D/2] = x[i + D/2] cos + x[i] sin.
// bf16/f16 inputs are computed in f32 and rounded once. Autocast: passthrough (runs in x's dtype).
Tensor rope(const Tensor& x, const RopeOptions& opt = {});

}  // namespace athanor
