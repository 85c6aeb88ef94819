#pragma once
// Saved-tensor hooks (PyTorch's torch.autograd.graph.saved_tensors_hooks): while a
// SavedTensorHooks scope lives on this thread, every tensor an op saves for backward
// (SavedTensor, autograd/node.h) is first offered to the scope's `pack` function. It may
// return a SavedTensorPack to keep instead of the tensor — something smaller from which
// the tensor can be rebuilt when backward needs it (a slice of it plus a collective that
// gathers the rest, a copy on another device, a recipe to recompute it) — or null, and
// the tensor is saved as usual.
//
//   {
//     SavedTensorHooks hooks([&](const Tensor& t) -> std::shared_ptr<SavedTensorPack> {
//       return t.storage() == gathered.storage() ? std::make_shared<Regather>(local) : nullptr;
//     });
//     y = linear(gathered, w, b);   // linear saves `gathered`: the hook keeps `local` instead
//   }
//
// Contract:
//  - SavedTensor::unpack calls the pack's unpack once per call: a pack that does work
//    (a collective) caches its result if the op may unpack more than once; every rank
//    runs the same ops' backwards in the same order, so unpacks that communicate match;
//  - the pack answers for the tensor it returns: the version check a plain SavedTensor
//    does (modified in place since saved?) applies to what the pack itself saved;
//  - `pack` runs with the hooks of its own scope switched off (a pack may save tensors);
//  - scopes nest; the innermost one is asked. The scope is thread-local: backward, which
//    only unpacks, may run anywhere.
#include <functional>
#include <memory>

#include "athanor/autograd/node.h"

namespace athanor {

using SavedTensorPackFn = std::function<std::shared_ptr<SavedTensorPack>(const Tensor& t)>;

class SavedTensorHooks {
 public:
  explicit SavedTensorHooks(SavedTensorPackFn pack);
  ~SavedTensorHooks();
  SavedTensorHooks(const SavedTensorHooks&) = delete;
  SavedTensorHooks& operator=(const SavedTensorHooks&) = delete;

 private:
  SavedTensorPackFn pack_;
  SavedTensorHooks* prev_;
  friend std::shared_ptr<SavedTensorPack> pack_saved_tensor(const Tensor& t);
};

// The innermost scope's pack of `t` (null without a scope, or when the scope declines).
std::shared_ptr<SavedTensorPack> pack_saved_tensor(const Tensor& t);

}  // namespace athanor
