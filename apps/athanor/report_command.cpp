// `athanor report RUN_DIR`: writes RUN_DIR/report.html (see athanor/observe/report.h) and prints its path.
#include <iostream>
#include <memory>

#include "athanor/observe/report.h"
#include "command_registry.h"

namespace athanor::cli {
namespace {
const bool registered = register_command(
    {"report", "Write report.html (charts, health events, config) for a run directory", [](CLI::App& sub) {
       auto dir = std::make_shared<std::string>();
       sub.add_option("run_dir", *dir, "run directory (holds metrics.jsonl)")->required();
       return [dir] {
         std::cout << observe::write_report(*dir) << "\n";
         return 0;
       };
     }});
}  // namespace
}  // namespace athanor::cli
