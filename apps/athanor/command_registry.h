#pragma once
// Subcommands that live in their own file register themselves here, so adding
// a command touches only its file:
//
//   // report_command.cpp
//   static const bool registered = athanor::cli::register_command(
//       {"report", "Write report.html for a run directory", [](CLI::App& sub) {
//          auto dir = std::make_shared<std::string>();
//          sub.add_option("run_dir", *dir, "run directory")->required();
//          return [dir] { return athanor::cli::report(*dir); };   // the exit status
//        }});
//
// main() adds every registered command as a CLI11 subcommand, calls `setup` to
// declare its options, and after parsing runs the returned function. Errors
// thrown as athanor::Error are printed by main() and give exit status 1.
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace athanor::cli {

using CommandRun = std::function<int()>;

struct CommandSpec {
  std::string name;
  std::string help;
  std::function<CommandRun(CLI::App&)> setup;
};

bool register_command(CommandSpec spec);
const std::vector<CommandSpec>& registered_commands();

}  // namespace athanor::cli
