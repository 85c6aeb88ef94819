#pragma once
// How the OpenMP worker threads wait between parallel regions.
//
// athanor's kernels and oneDNN (the Debian build uses the OpenMP runtime) share one
// libgomp thread pool. By default libgomp keeps idle workers spinning for ~300k
// iterations after each parallel region. A training step runs hundreds of short
// regions separated by serial work (autograd bookkeeping, allocation), so the idle
// worker burns a core while the main thread works alone; on a machine shared with
// other processes the spinners also take cores from whoever holds the data they wait
// for: on a loaded machine the step then runs several times slower than with passive
// waiting (bench/RESULTS.md, "OpenMP waiting"). Passive waiting costs a futex wake-up (a
// few microseconds) per region, negligible against that.
//
//
// libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when it is loaded, so a
// library cannot change them with setenv(). A program that wants the passive policy
// calls ensure_passive_openmp_wait(argv) first thing in main(): when the user has set
// neither variable, it sets OMP_WAIT_POLICY=PASSIVE and re-executes the program
// (/proc/self/exe) with the same arguments; otherwise it returns and the user's
// choice stands. ATHANOR_OMP_REEXEC=0 disables the re-exec.
namespace athanor::cpu {

// Returns normally when no re-exec is needed or it failed (then the run goes on
// with the default policy); does not return when the re-exec succeeds.
void ensure_passive_openmp_wait(char** argv);

// "passive", "active", "spincount" (GOMP_SPINCOUNT set) or "default": what the process runs with (for logs).
const char* openmp_wait_policy();

}  // namespace athanor::cpu
