// ensure_passive_openmp_wait: re-executes the program with OMP_WAIT_POLICY=PASSIVE when
// the user set no policy, and leaves an explicit choice alone. Each case runs in a
// forked child so the test process's own environment is untouched.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "backend/cpu/thread_env.h"
#include "test_util.h"

namespace athanor {
namespace {
// Runs fn in a forked child and returns its exit status (-1 if it did not exit normally).
template <class Fn> int in_child(Fn&& fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
}  // namespace

// Helper run only by the re-executed child: records the policy it sees.
TEST(ThreadEnv, DISABLED_ReportPolicyToFile) {
  const char* out = std::getenv("ATHANOR_TEST_POLICY_OUT");
  ASSERT_NE(out, nullptr);
  std::ofstream(out) << cpu::openmp_wait_policy() << " " << std::getenv("OMP_WAIT_POLICY");
}

TEST(ThreadEnv, ReexecsWithPassivePolicyWhenUnset) {
  const std::string file = testing::fresh_temp_dir("thread_env") + "/policy.txt";
  const int rc = in_child([&] {
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("GOMP_SPINCOUNT");
    unsetenv("ATHANOR_OMP_REEXEC");
    setenv("ATHANOR_TEST_POLICY_OUT", file.c_str(), 1);
    char a0[] = "/proc/self/exe", a1[] = "--gtest_also_run_disabled_tests",
         a2[] = "--gtest_filter=ThreadEnv.DISABLED_ReportPolicyToFile";
    char* argv[] = {a0, a1, a2, nullptr};
    cpu::ensure_passive_openmp_wait(argv);
    _exit(42);  // reached only when no re-exec happened
  });
  EXPECT_EQ(rc, 0) << "the re-executed test binary should run the report test and pass";
  std::string policy, raw;
  std::ifstream(file) >> policy >> raw;
  EXPECT_EQ(policy, "passive");
  EXPECT_EQ(raw, "PASSIVE");
}

TEST(ThreadEnv, KeepsAnExplicitChoice) {
  for (const char* var : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
    SCOPED_TRACE(var);
    const int rc = in_child([&] {
      unsetenv("OMP_WAIT_POLICY");
      unsetenv("GOMP_SPINCOUNT");
      unsetenv("ATHANOR_OMP_REEXEC");
      setenv(var, std::string(var) == "GOMP_SPINCOUNT" ? "1000" : "ACTIVE", 1);
      char a0[] = "/bin/false";
      char* argv[] = {a0, nullptr};
      cpu::ensure_passive_openmp_wait(argv);
      _exit(std::string(cpu::openmp_wait_policy()) == (std::string(var) == "GOMP_SPINCOUNT" ? "spincount" : "active") ? 7 : 8);
    });
    EXPECT_EQ(rc, 7) << "no re-exec, and the policy is reported as set";
  }
  // ATHANOR_OMP_REEXEC=0 opts out.
  const int rc = in_child([&] {
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("GOMP_SPINCOUNT");
    setenv("ATHANOR_OMP_REEXEC", "0", 1);
    char a0[] = "/bin/false";
    char* argv[] = {a0, nullptr};
    cpu::ensure_passive_openmp_wait(argv);
    _exit(std::string(cpu::openmp_wait_policy()) == "default" ? 7 : 8);
  });
  EXPECT_EQ(rc, 7);
}

}  // namespace athanor
