// `athanor doctor RUN_DIR [--baseline RUN_DIR] [--json]`: what went wrong in a run and what
// to change (observe/doctor.h). Exit status 0 when no problem was found, 1 when the doctor
// found one (a warning or an error), as the README documents.
#include <iostream>
#include <memory>

#include "athanor/observe/doctor.h"
#include "command_registry.h"

namespace {
struct DoctorArgs {
  std::string dir, baseline;
  bool json = false;
};
const bool registered = athanor::cli::register_command(
    {"doctor", "Diagnose a run directory: status, loss trend, problems and the config changes that fix them", [](CLI::App& sub) {
       auto a = std::make_shared<DoctorArgs>();
       sub.add_option("run_dir", a->dir, "run directory (holds metrics.jsonl)")->required();
       sub.add_option("--baseline", a->baseline,
                      "a run of the same model and data to compare progress per sample with (batch and lr scaling)");
       sub.add_flag("--json", a->json, "print the diagnosis as JSON (findings with their config fixes, and the health events)");
       return [a] {
         const athanor::observe::DoctorReport r = athanor::observe::diagnose(a->dir, {a->baseline});
         std::cout << (a->json ? r.json() : r.text);
         return r.healthy() ? 0 : 1;
       };
     }});
}  // namespace
