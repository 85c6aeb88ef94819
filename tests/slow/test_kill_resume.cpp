// Fault injection: `athanor train --resume` with a checkpoint every 2 steps is
// killed with SIGKILL at random moments (>= 20 times, bounded to ~2 minutes) and
// restarted each time. After every kill: every visible step-NNNNNN directory
// verifies (a partial save is never visible), and `latest` names a valid
// checkpoint. At the end the weights equal an uninterrupted run's, bit for bit.
// The CLI binary is found next to this test's build directory
// (<build>/apps/athanor/athanor) or through $ATHANOR_BIN.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/safetensors.h"
#include "test_util.h"

extern char** environ;

namespace athanor {
namespace fs = std::filesystem;

namespace {
std::string athanor_bin() {
  if (const char* b = std::getenv("ATHANOR_BIN")) return b;
  const fs::path self = fs::read_symlink("/proc/self/exe");  // <build>/tests/athanor_tests_slow
  return (self.parent_path().parent_path() / "apps" / "athanor" / "athanor").string();
}

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> tensor_bytes(const std::string& path) {
  std::vector<std::string> out;
  for (auto& [n, t] : ckpt::load_safetensors(path).tensors) {
    Tensor c = t.contiguous();
    out.push_back(n + ":" + std::string(static_cast<const char*>(c.raw_data()), c.nbytes()));
  }
  return out;
}
}  // namespace

TEST(KillResume, SigkillAtRandomMomentsNeverCorruptsAndResumesBitExact) {
  const std::string bin = athanor_bin();
  ATHANOR_SKIP_IF_MISSING(!fs::exists(bin), "the athanor CLI is not built at " << bin << " (set ATHANOR_BIN)");
  const fs::path dir = fs::temp_directory_path() / "athanor_kill_resume";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 17) + ". ";
  std::ofstream(dir / "tiny.txt") << text;
  std::ofstream(dir / "cfg.yaml")
      << "out_dir: " << (dir / "runs").string() << "\n"
      << "model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.1}\n"
      << "data: {type: text, tokenizer: byte, corpus: " << (dir / "tiny.txt").string() << ", cache_dir: " << (dir / "cache").string()
      << ", num_workers: 2}\n"
      << "optimizer: {type: adamw, lr: 0.003}\n"
      << "trainer: {max_steps: 600, batch_size: 4, eval_every: 0, eval_batches: 1, sample_tokens: 4, log_every: 50}\n"
      << "checkpoint: {every: 2, keep_last: 2, keep_every: 100}\n";
  const std::string cfg = (dir / "cfg.yaml").string();

  // The uninterrupted reference (also prepares the token cache).
  ASSERT_EQ(wait_exit(spawn({bin, "train", cfg, "name=ref"})), 0);
  const auto reference = tensor_bytes((dir / "runs" / "ref" / "model.safetensors").string());

  const std::string cdir = (dir / "runs" / "kill" / "checkpoints").string();
  const unsigned seed = static_cast<unsigned>(std::random_device{}());
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> delay_ms(20, 700);
  const auto t0 = std::chrono::steady_clock::now();
  int kills = 0, finished = 0;
  while (kills < 40 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(100)) {
    const pid_t pid = spawn({bin, "train", cfg, "name=kill", "--resume"});
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    kill(pid, SIGKILL);
    const int rc = wait_exit(pid);
    if (rc == 128 + SIGKILL) ++kills;
    else if (rc == 0) ++finished;
    else FAIL() << "athanor train exited with " << rc << " (seed " << seed << ")";
    // Invariants after every kill.
    for (const auto& [step, name] : ckpt::list_checkpoints(cdir))
      EXPECT_NO_THROW(ckpt::verify_checkpoint(cdir + "/" + name)) << name << " is visible but invalid (seed " << seed << ")";
    const std::string latest = ckpt::read_latest(cdir);
    if (!latest.empty()) {
      EXPECT_NO_THROW(ckpt::verify_checkpoint(cdir + "/" + latest)) << "latest names " << latest << " (seed " << seed << ")";
    }
    if (kills >= 20 && finished == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) break;
  }
  std::cout << "[          ] " << kills << " SIGKILLs, " << finished << " runs finished before their kill (seed " << seed << ")\n";
  EXPECT_GE(kills, 20) << "seed " << seed;
  // Finish the run without interruption and compare.
  ASSERT_EQ(wait_exit(spawn({bin, "train", cfg, "name=kill", "--resume"})), 0);
  const auto resumed = tensor_bytes((dir / "runs" / "kill" / "model.safetensors").string());
  ASSERT_EQ(resumed.size(), reference.size());
  for (size_t i = 0; i < resumed.size(); ++i)
    EXPECT_TRUE(resumed[i] == reference[i]) << "tensor " << i << " differs after " << kills << " kills (seed " << seed << ")";
  EXPECT_EQ(ckpt::find_latest_valid(cdir).step, 600);
}

}  // namespace athanor
