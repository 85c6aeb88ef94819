#pragma once
// The error both DDP and ZeRO raise when a parameter got no gradient in a step:
// every rank must contribute to every bucket, or the collectives would not match.
#include <sstream>
#include <string>
#include <vector>

#include "athanor/core/error.h"

namespace athanor::dist {

[[noreturn]] inline void fail_unused_parameters(const char* who, const std::vector<std::string>& unused) {
  std::ostringstream os;
  for (std::size_t i = 0; i < unused.size(); ++i) os << (i ? ", " : "") << "'" << unused[i] << "'";
  ATH_FAIL(who, unused.size(), " parameter(s) received no gradient in this step: ", os.str(),
           Hint{"every trainable parameter must take part in the loss on every rank; freeze unused ones "
                "(requires_grad=false) before wrapping the module"});
}

// Called when a step's gradients are being collected: if some parameter is not ready,
// lets the buckets already in flight complete (so the group stays consistent), resets
// the step and raises the error above. Params have .ready and .name; buckets .work.
template <class Params, class Buckets, class Reset>
void fail_if_unused(const char* who, const Params& params, const Buckets& buckets, Reset&& reset_step) {
  std::vector<std::string> unused;
  for (const auto& p : params)
    if (!p.ready) unused.push_back(p.name);
  if (unused.empty()) return;
  for (const auto& b : buckets)
    if (b.work) b.work->wait();
  reset_step();
  fail_unused_parameters(who, unused);
}

}  // namespace athanor::dist
