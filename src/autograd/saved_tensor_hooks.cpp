// Saved-tensor hooks: the thread's innermost scope (contract in autograd/saved_tensor_hooks.h).
#include "athanor/autograd/saved_tensor_hooks.h"

namespace athanor {
namespace {
thread_local SavedTensorHooks* t_innermost = nullptr;
}

SavedTensorHooks::SavedTensorHooks(SavedTensorPackFn pack) : pack_(std::move(pack)), prev_(t_innermost) { t_innermost = this; }
SavedTensorHooks::~SavedTensorHooks() { t_innermost = prev_; }

std::shared_ptr<SavedTensorPack> pack_saved_tensor(const Tensor& t) {
  SavedTensorHooks* h = t_innermost;
  if (h == nullptr || !h->pack_) return nullptr;
  // The pack may save tensors itself (SavedTensor): those are saved as usual.
  t_innermost = nullptr;
  struct Restore {
    SavedTensorHooks* h;
    ~Restore() { t_innermost = h; }
  } restore{h};
  return h->pack_(t);
}

}  // namespace athanor
