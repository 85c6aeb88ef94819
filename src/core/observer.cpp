#include "athanor/core/observer.h"

namespace athanor {
namespace detail {
std::atomic<OpObserver*> g_op_observer{nullptr};
}

void set_op_observer(OpObserver* o) { detail::g_op_observer.store(o, std::memory_order_release); }

}  // namespace athanor
