#pragma once
#include <optional>

#include "athanor/core/tensor.h"

namespace athanor {

// weight: [num_embeddings, dim]; ids: integer tensor of any shape -> [..., dim].
// Rows at padding_idx get no gradient. Ids out of range raise an Error naming the id.
Tensor embedding(const Tensor& weight, const Tensor& ids, std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace athanor
