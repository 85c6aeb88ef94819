// Checkpoint I/O against plain file I/O of the same bytes, for a GPT with the
// shapes of examples/gpt2-124m.yaml (~124M f32 parameters, ~500 MB):
//   save   ckpt::save_safetensors of model.state_dict() (header, write, fsync, rename)
//   plain  open + write() of the same number of bytes + fsync + close
//   load   ckpt::load_safetensors + GPT::load_state_dict (the bytes land in the model)
//   plain  open + read() of the same number of bytes into a buffer
// Page cache is not dropped: both sides run warm. Median, min, max over N repetitions,
// the two sides of each comparison alternating.
// Then a whole training checkpoint, weights + AdamW state (exp_avg, exp_avg_sq: ~1.5 GB), as
// the trainer writes it, against `cp` of the same files on the same disk:
//   ckpt save   ckpt::save_checkpoint (tmp dir, files hashed with XXH3-128 as written, fsync,
//               MANIFEST.json, renames, `latest`)
//   ckpt load   ckpt::verify_checkpoint (every file hashed) + load_safetensors_into both files
//   cp          `cp -r` of the committed step directory to a new directory, then `sync -f` (the
//               same bytes copied and made durable), in its best case: the source warm in the
//               page cache and the previous copy removed beforehand, untimed
//   ./build/bench/bench_ckpt_io [DIR] [REPS]     (DIR default: the current directory)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/core/error.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops.h"

using namespace athanor;
namespace fs = std::filesystem;

namespace {
struct Stats {
  double median, min, max;
};

// Runs a and b alternately (a warm-up pair, then `reps` timed pairs) so that both
// see the same background load on a shared machine.
// `before_b` runs untimed before each b (setting up cp's best case).
std::pair<Stats, Stats> time_pairs(int reps, const std::function<void()>& a, const std::function<void()>& b,
                                   const std::function<void()>& before_b = {}) {
  a();
  if (before_b) before_b();
  b();
  std::vector<double> ta, tb;
  auto timed = [](const std::function<void()>& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < reps; ++i) {
    ta.push_back(timed(a));
    if (before_b) before_b();
    tb.push_back(timed(b));
  }
  auto stats = [](std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return Stats{t[t.size() / 2], t.front(), t.back()};
  };
  return {stats(ta), stats(tb)};
}

void plain_write(const std::string& path, const std::vector<char>& buf) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ATH_CHECK(fd >= 0, "bench", "cannot create ", path, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t w = ::write(fd, buf.data() + done, buf.size() - done);
    ATH_CHECK(w > 0 || errno == EINTR, "bench", "write failed: ", std::strerror(errno));
    if (w > 0) done += static_cast<size_t>(w);
  }
  ATH_CHECK(::fsync(fd) == 0, "bench", "fsync failed");
  ::close(fd);
}

void plain_read(const std::string& path, std::vector<char>& buf) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ATH_CHECK(fd >= 0, "bench", "cannot open ", path);
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t r = ::read(fd, buf.data() + done, buf.size() - done);
    ATH_CHECK(r > 0 || (r < 0 && errno == EINTR), "bench", "read failed or short file");
    if (r > 0) done += static_cast<size_t>(r);
  }
  ::close(fd);
}

void print(const char* what, const Stats& s, double mb) {
  std::printf("  %-34s median %7.3f s  min %7.3f  max %7.3f  (%6.0f MB/s)\n", what, s.median, s.min, s.max, mb / s.median);
}
}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  nn::GPTConfig c;  // examples/gpt2-124m.yaml
  c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.block_size = 256, c.vocab_size = 50304;
  nn::GPT model(c);
  const nn::StateDict state = model.state_dict();
  size_t bytes = 0;
  int64_t params = 0;
  for (const auto& [n, t] : state) bytes += t.nbytes(), params += t.numel();
  const double mb = static_cast<double>(bytes) / 1e6;
  std::printf("GPT %lld params, %zu tensors, %.1f MB of f32; dir %s; %d reps (+1 warm-up), page cache warm\n",
              static_cast<long long>(params), state.size(), mb, fs::absolute(dir).c_str(), reps);

  const std::string st_path = (fs::path(dir) / "bench_ckpt_io.model.safetensors").string();
  const std::string raw_path = (fs::path(dir) / "bench_ckpt_io.plain.bin").string();
  std::vector<char> buf(bytes, 1);

  const auto [save, write] = time_pairs(reps, [&] { ckpt::save_safetensors(st_path, state); }, [&] { plain_write(raw_path, buf); });
  const auto [load, read] = time_pairs(
      reps,
      [&] {
        const ckpt::SafetensorsFile f = ckpt::load_safetensors(st_path);
        model.load_state_dict(f.tensors);
      },
      [&] { plain_read(raw_path, buf); });
  const auto [parse_only, read2] = time_pairs(reps, [&] { (void)ckpt::load_safetensors(st_path); }, [&] { plain_read(raw_path, buf); });
  (void)read2;
  // What a resume does: straight into the existing parameters (one copy, like read()).
  const auto [into, read3] = time_pairs(reps, [&] { ckpt::load_safetensors_into(st_path, state); }, [&] { plain_read(raw_path, buf); });
  print("save_safetensors (+fsync)", save, mb);
  print("plain write() + fsync", write, mb);
  print("load_safetensors + load_state_dict", load, mb);
  print("load_safetensors alone (mmap)", parse_only, mb);
  print("load_safetensors_into (resume)", into, mb);
  print("plain read()", read, mb);
  std::printf("ratio save/write %.2f (target <= 2), load_into/read %.2f (target <= 2), load+load_state_dict/read %.2f\n",
              save.median / write.median, into.median / read3.median, load.median / read.median);
  fs::remove(st_path);
  fs::remove(raw_path);

  // A whole training checkpoint: the weights and AdamW's two moments per parameter.
  ckpt::NamedTensors opt_state;
  for (const auto& [n, t] : state) {
    opt_state.emplace_back(n + ".exp_avg", full(t.sizes(), 1e-3));
    opt_state.emplace_back(n + ".exp_avg_sq", full(t.sizes(), 1e-6));
  }
  ckpt::NamedTensors weights(state.begin(), state.end());
  const std::vector<ckpt::TensorFile> files = {{"model.safetensors", weights, {}}, {"optimizer.safetensors", opt_state, {}}};
  const std::string ck_dir = (fs::path(dir) / "bench_ckpt_io.checkpoints").string();
  const std::string cp_dir = (fs::path(dir) / "bench_ckpt_io.cp").string();
  fs::remove_all(ck_dir);
  fs::remove_all(cp_dir);
  std::string step_dir;
  int64_t step = 0;
  // cp's best case, untimed: the target removed and the source in the page cache (the
  // checkpoint's writer goes around the cache, so its files are not there after a save).
  const auto cp_best_case = [&] {
    fs::remove_all(cp_dir);
    std::vector<char> chunk(size_t{8} << 20);
    for (const auto& e : fs::directory_iterator(step_dir)) {
      std::FILE* f = std::fopen(e.path().c_str(), "rb");
      ATH_CHECK(f != nullptr, "bench", "cannot read ", e.path().string());
      while (std::fread(chunk.data(), 1, chunk.size(), f) > 0) {
      }
      std::fclose(f);
    }
  };
  const auto cp_step = [&] {
    const std::string cmd = "cp -r '" + step_dir + "' '" + cp_dir + "' && sync -f '" + cp_dir + "'";
    ATH_CHECK(std::system(cmd.c_str()) == 0, "bench", "'", cmd, "' failed");
  };
  double ck_bytes = 0;
  const auto [ck_save, cp_save] = time_pairs(
      reps, [&] { step_dir = ckpt::save_checkpoint(ck_dir, ++step, files, {{"state.json", "{}"}}); },
      cp_step, cp_best_case);
  for (const auto& e : fs::directory_iterator(step_dir)) ck_bytes += static_cast<double>(fs::file_size(e.path()));
  const ckpt::NamedTensors opt_into = opt_state;
  const auto [ck_load, cp_load] = time_pairs(
      reps,
      [&] {
        (void)ckpt::verify_checkpoint(step_dir);
        ckpt::load_safetensors_into((fs::path(step_dir) / "model.safetensors").string(), weights);
        ckpt::load_safetensors_into((fs::path(step_dir) / "optimizer.safetensors").string(), opt_into);
      },
      cp_step, cp_best_case);
  const double ck_mb = ck_bytes / 1e6;
  std::printf("checkpoint: weights + AdamW state, %.1f MB in %s\n", ck_mb, step_dir.c_str());
  print("save_checkpoint (xxh3, fsync, commit)", ck_save, ck_mb);
  print("verify_checkpoint + load_into (both)", ck_load, ck_mb);
  print("cp -r + sync -f", cp_save, ck_mb);
  std::printf("ratio checkpoint save/cp %.2f (target <= 1.3), load/cp %.2f\n", ck_save.median / cp_save.median,
              ck_load.median / cp_load.median);
  fs::remove_all(ck_dir);
  fs::remove_all(cp_dir);
  return 0;
}
