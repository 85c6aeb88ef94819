#include "command_registry.h"

namespace athanor::cli {

static std::vector<CommandSpec>& registry() {
  static std::vector<CommandSpec> commands;  // function-local: safe across static initialisation order
  return commands;
}

bool register_command(CommandSpec spec) {
  registry().push_back(std::move(spec));
  return true;
}

const std::vector<CommandSpec>& registered_commands() { return registry(); }

}  // namespace athanor::cli
