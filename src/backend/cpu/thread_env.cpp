// See thread_env.h: make the OpenMP workers wait passively, by re-exec when needed.
#include "backend/cpu/thread_env.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace athanor::cpu {

void ensure_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;  // the user's choice stands
  const char* guard = std::getenv("ATHANOR_OMP_REEXEC");
  if (guard && std::strcmp(guard, "0") == 0) return;
  // The guard also stops a loop if the exec'd program somehow does not see the variable.
  if (guard && std::strcmp(guard, "done") == 0) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0 || setenv("ATHANOR_OMP_REEXEC", "done", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // exec failed (no /proc, say): keep running with libgomp's default policy.
}

const char* openmp_wait_policy() {
  const char* p = std::getenv("OMP_WAIT_POLICY");
  if (p && (std::strcmp(p, "PASSIVE") == 0 || std::strcmp(p, "passive") == 0)) return "passive";
  if (p && (std::strcmp(p, "ACTIVE") == 0 || std::strcmp(p, "active") == 0)) return "active";
  if (std::getenv("GOMP_SPINCOUNT")) return "spincount";
  return "default";
}

}  // namespace athanor::cpu
