// `athanor train | eval | generate | prepare`: the training system from the command line.
#include "train_commands.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "athanor/core/error.h"
#include "athanor/data/corpus.h"
#include "athanor/data/token_shard.h"
#include "athanor/train/trainer.h"

namespace athanor::cli {
namespace fs = std::filesystem;

namespace {
bool launched_with_several_processes() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v) > 1;
  return false;
}

// A finished run: its resolved config and final weights.
train::Config run_config(const std::string& run_dir, const std::vector<std::string>& overrides) {
  const fs::path cfg = fs::path(run_dir) / "config.yaml";
  ATH_CHECK(fs::exists(cfg), "cli", "'", run_dir, "' is not a run directory (no config.yaml)",
            Hint{"pass the directory a training run wrote, e.g. runs/gpt-char"});
  train::Config c = train::Config::load(cfg.string(), overrides);
  // A tensor- or pipeline-parallel run's model.safetensors is the merged (logical) model: one
  // process can evaluate and sample it. Under mpirun the run's layout is kept.
  if ((c.get_int("dist.tp") > 1 || c.get_int("dist.pp") > 1) && !launched_with_several_processes()) {
    std::cerr << "note: " << run_dir << " trained with dist.tp " << c.get_int("dist.tp") << ", dist.pp " << c.get_int("dist.pp")
              << "; evaluating its merged weights in one process (dist.tp 1, dist.pp 1)\n";
    c.set("dist.tp", int64_t{1});
    c.set("dist.pp", int64_t{1});
    c.set("dist.virtual_stages", int64_t{1});
    c.set("dist.pp_layers", std::vector<int64_t>{});
  }
  return c;
}
void load_final_weights(train::Trainer& t, const std::string& run_dir) {
  const fs::path w = fs::path(run_dir) / "model.safetensors";
  ATH_CHECK(fs::exists(w), "cli", "'", run_dir, "' has no model.safetensors", Hint{"the run did not finish; train it to the end first"});
  t.load_weights(w.string());
}
}  // namespace

int train(const std::string& config_path, const std::vector<std::string>& overrides) {
  train::Trainer t(train::Config::load(config_path, overrides));
  t.fit();
  if (t.rank() != 0) return 0;  // under mpirun only rank 0 speaks
  std::cout << "done: " << t.step() << " steps";
  if (!t.evals().empty()) {
    const auto& e = t.evals().back();
    std::cout << ", final val loss " << e.loss;
    if (e.accuracy >= 0) std::cout << ", accuracy " << 100 * e.accuracy << "%";
  }
  std::cout << "; weights and metrics in " << t.run_dir() << "\n";
  return 0;
}

int eval(const std::string& run_dir, const std::vector<std::string>& overrides) {
  train::Trainer t(run_config(run_dir, overrides), /*write_run_files=*/false);
  load_final_weights(t, run_dir);
  t.evaluate();
  return 0;
}

int generate(const std::string& run_dir, const std::string& prompt, int64_t tokens, const std::vector<std::string>& overrides) {
  train::Trainer t(run_config(run_dir, overrides), /*write_run_files=*/false);
  load_final_weights(t, run_dir);
  std::cout << t.sample(tokens, prompt) << "\n";
  return 0;
}

int prepare(const std::string& corpus, const std::string& out_dir, const std::string& tokenizer,
            const std::string& tokenizer_dir, const std::string& corpus_dir, double val_fraction) {
  std::string text = corpus;
  if (corpus == "brown") {
    fs::create_directories(out_dir);
    text = (fs::path(out_dir) / "brown.txt").string();
    std::ofstream(text) << data::brown_corpus_text(corpus_dir);
  }
  auto [train_path, val_path] = data::prepare_text(text, out_dir, tokenizer, tokenizer_dir, val_fraction);
  std::cout << "wrote " << train_path << " and " << val_path << "\n";
  return 0;
}

}  // namespace athanor::cli
