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

}  // namespace athanor::dist
