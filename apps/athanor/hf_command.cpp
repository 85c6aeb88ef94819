// Hugging Face GPT-2 interop from the command line (ckpt/hf_gpt2.h):
//   athanor export-hf RUN_DIR OUT_DIR [--checkpoint DIR]
//       the run's GPT (RUN_DIR/config.yaml) with the weights of its newest valid
//       checkpoint (or DIR) -> OUT_DIR/model.safetensors + OUT_DIR/config.json
//   athanor import-hf HF_DIR OUT_FILE
//       a Hugging Face GPT-2 directory -> one safetensors file in athanor's names and
//       layout (f32), with the GPT config in its metadata
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/hf_gpt2.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/ckpt/sharded_checkpoint.h"
#include "athanor/core/error.h"
#include "athanor/train/config.h"
#include "athanor/train/trainer.h"
#include "command_registry.h"

namespace athanor::cli {
namespace fs = std::filesystem;

namespace {
int export_hf(const std::string& run_dir, const std::string& out_dir, const std::string& checkpoint) {
  const std::string cfg_path = (fs::path(run_dir) / "config.yaml").string();
  ATH_CHECK(fs::exists(cfg_path), "export-hf", "'", cfg_path, "' does not exist",
            Hint{"RUN_DIR is a run directory written by `athanor train` (it holds config.yaml and checkpoints/)"});
  const train::Config c = train::Config::load(cfg_path);
  ATH_CHECK(c.get_string("model.type") == "gpt", "export-hf", cfg_path, ": model.type is '", c.get_string("model.type"),
            "'; only GPT models can be exported to Hugging Face GPT-2");
  nn::GPTConfig g = train::gpt_config(c);
  ATH_CHECK(g.vocab_size > 0, "export-hf", cfg_path, ": model.vocab_size is 0 (the tokenizer's, not resolved)",
            Hint{"set model.vocab_size in the run's config.yaml"});

  std::string ckpt_dir = checkpoint;
  if (ckpt_dir.empty()) {
    const ckpt::LatestCheckpoint latest = ckpt::find_latest_valid((fs::path(run_dir) / "checkpoints").string());
    for (const auto& s : latest.skipped) std::cerr << "export-hf: skipped " << s << "\n";
    ATH_CHECK(!latest.path.empty(), "export-hf", run_dir, ": no valid checkpoint in ", (fs::path(run_dir) / "checkpoints").string(),
              Hint{"train with checkpointing on, or pass --checkpoint DIR"});
    ckpt_dir = latest.path;
  } else {
    ckpt::verify_checkpoint(ckpt_dir);
  }
  // One file, or the shards of a data-parallel run merged (ckpt/sharded_checkpoint.h).
  const ckpt::SafetensorsFile weights = ckpt::load_checkpoint_tensors(ckpt_dir, "model");
  nn::GPT model(g);
  model.load_state_dict(weights.tensors, /*strict=*/true);
  ckpt::export_hf_gpt2(model, out_dir);
  std::cout << "exported " << ckpt_dir << " to " << out_dir << " (model.safetensors, config.json)\n";
  return 0;
}

int import_hf(const std::string& hf_dir, const std::string& out_file) {
  const ckpt::HfGpt2 hf = ckpt::import_hf_gpt2(hf_dir);
  const nn::GPTConfig& g = hf.config;
  ckpt::save_safetensors(out_file, hf.state,
                         {{"source", hf_dir},
                          {"n_layer", std::to_string(g.n_layer)},
                          {"n_head", std::to_string(g.n_head)},
                          {"n_embd", std::to_string(g.n_embd)},
                          {"block_size", std::to_string(g.block_size)},
                          {"vocab_size", std::to_string(g.vocab_size)}});
  std::cout << "imported " << hf_dir << " (" << hf.state.size() << " tensors, n_layer " << g.n_layer << ", n_embd "
            << g.n_embd << ") to " << out_file << "\n";
  return 0;
}

const bool export_registered = register_command(
    {"export-hf", "Export a run's GPT as a Hugging Face GPT-2 directory (model.safetensors + config.json)", [](CLI::App& sub) {
       auto run_dir = std::make_shared<std::string>();
       auto out_dir = std::make_shared<std::string>();
       auto checkpoint = std::make_shared<std::string>();
       sub.add_option("run_dir", *run_dir, "run directory (config.yaml, checkpoints/)")->required();
       sub.add_option("out_dir", *out_dir, "directory to write model.safetensors and config.json into")->required();
       sub.add_option("--checkpoint", *checkpoint, "a checkpoint directory to export instead of the newest valid one");
       return [=] { return export_hf(*run_dir, *out_dir, *checkpoint); };
     }});

const bool import_registered = register_command(
    {"import-hf", "Convert a Hugging Face GPT-2 directory into an athanor safetensors file", [](CLI::App& sub) {
       auto hf_dir = std::make_shared<std::string>();
       auto out_file = std::make_shared<std::string>();
       sub.add_option("hf_dir", *hf_dir, "directory with config.json and model.safetensors")->required();
       sub.add_option("out_file", *out_file, "safetensors file to write (athanor names and layout)")->required();
       return [=] { return import_hf(*hf_dir, *out_file); };
     }});
}  // namespace

}  // namespace athanor::cli
