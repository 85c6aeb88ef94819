// `athanor doctor RUN_DIR`: what went wrong in a run and what to try (observe/doctor.h).
// Exit status 0 when healthy (warnings allowed), 1 when a problem of severity error was found.
#include <iostream>
#include <memory>

#include "athanor/observe/doctor.h"
#include "command_registry.h"

namespace {
const bool registered = athanor::cli::register_command(
    {"doctor", "Diagnose a run directory: status, loss trend, problems and what to try", [](CLI::App& sub) {
       auto dir = std::make_shared<std::string>();
       sub.add_option("run_dir", *dir, "run directory (holds metrics.jsonl)")->required();
       return [dir] {
         const athanor::observe::DoctorReport r = athanor::observe::diagnose(*dir);
         std::cout << r.text;
         return r.errors > 0 ? 1 : 0;
       };
     }});
}  // namespace
