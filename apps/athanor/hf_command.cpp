// Hugging Face GPT-2 interop from the command line (ckpt/hf_gpt2.h):
//   athanor export-hf RUN_DIR OUT_DIR [--checkpoint DIR]
//       the run's GPT (RUN_DIR/config.yaml) with its newest weights: the newest valid
//       checkpoint or the final RUN_DIR/model.safetensors, whichever is of the later step
//       (or DIR) -> OUT_DIR/model.safetensors + OUT_DIR/config.json
//   athanor import-hf HF_DIR OUT_FILE
//       a Hugging Face GPT-2 directory -> one safetensors file in athanor's names and
//       layout (f32), with the GPT config in its metadata
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/hf_gpt2.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/ckpt/sharded_checkpoint.h"
#include "athanor/core/error.h"
#include "athanor/train/checkpointer.h"
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

  nn::GPT model(g);
  std::string source;
  if (!checkpoint.empty()) {
    ckpt::verify_checkpoint(checkpoint);
    // One file, or the shards of a data-parallel run merged (ckpt/sharded_checkpoint.h).
    model.load_state_dict(ckpt::load_checkpoint_tensors(checkpoint, "model").tensors, /*strict=*/true);
    source = checkpoint;
  } else {
    // The newest weights the run has: its newest valid checkpoint, or the model.safetensors it
    // wrote when it finished (the README's demo run has only that), whichever is of a later step.
    const std::string ckpt_root = (fs::path(run_dir) / "checkpoints").string();
    if (const std::string note = train::stale_latest_note(ckpt_root); !note.empty()) std::cerr << "export-hf: warning: " << note << "\n";
    const ckpt::LatestCheckpoint latest = ckpt::find_latest_valid(ckpt_root);
    for (const auto& s : latest.skipped) std::cerr << "export-hf: skipped " << s << "\n";
    const fs::path final_path = fs::path(run_dir) / "model.safetensors";
    std::optional<ckpt::SafetensorsFile> final_weights;
    int64_t final_step = -1;
    if (fs::exists(final_path)) {
      final_weights = ckpt::load_safetensors(final_path.string());
      if (auto it = final_weights->metadata.find("step"); it != final_weights->metadata.end()) final_step = std::atoll(it->second.c_str());
    }
    ATH_CHECK(!latest.path.empty() || final_weights, "export-hf", run_dir, ": no valid checkpoint in ", ckpt_root,
              " and no final model.safetensors",
              Hint{"pass the directory of a run that finished (it writes model.safetensors) or saved checkpoints, or pass --checkpoint DIR"});
    if (final_weights && (latest.path.empty() || final_step >= latest.step)) {
      model.load_state_dict(final_weights->tensors, /*strict=*/true);
      source = final_path.string();
    } else {
      model.load_state_dict(ckpt::load_checkpoint_tensors(latest.path, "model").tensors, /*strict=*/true);
      source = latest.path;
    }
  }
  ckpt::export_hf_gpt2(model, out_dir);
  std::cout << "exported " << source << " to " << out_dir << " (model.safetensors, config.json)\n";
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
       sub.add_option("run_dir", *run_dir, "run directory (config.yaml; checkpoints/ or model.safetensors)")->required();
       sub.add_option("out_dir", *out_dir, "directory to write model.safetensors and config.json into")->required();
       sub.add_option("--checkpoint", *checkpoint, "a checkpoint directory to export instead of the run's newest weights");
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
