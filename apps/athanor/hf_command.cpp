// Hugging Face interop from the command line (ckpt/hf_gpt2.h, ckpt/hf_llama.h):
//   athanor export-hf RUN_DIR OUT_DIR [--checkpoint DIR]
//       the run's model (RUN_DIR/config.yaml; model.type gpt -> GPT-2, llama -> Llama) with
//       its newest weights: the newest valid checkpoint or the final RUN_DIR/model.safetensors,
//       whichever is of the later step (or DIR) -> OUT_DIR/model.safetensors + OUT_DIR/config.json
//   athanor import-hf HF_DIR OUT_FILE
//       a Hugging Face GPT-2 or Llama directory (the family from config.json's model_type or
//       architectures) -> one safetensors file in athanor's names and layout (f32), with the
//       model config in its metadata
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/hf_gpt2.h"
#include "athanor/ckpt/hf_llama.h"
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
// Loads the run's newest weights (or `checkpoint`'s) into `model`; returns where they came from.
std::string load_run_weights(nn::Module& model, const std::string& run_dir, const std::string& checkpoint) {
  if (!checkpoint.empty()) {
    ckpt::verify_checkpoint(checkpoint);
    // One file, or the shards of a data-parallel run merged (ckpt/sharded_checkpoint.h).
    model.load_state_dict(ckpt::load_checkpoint_tensors(checkpoint, "model").tensors, /*strict=*/true);
    return checkpoint;
  }
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
    return final_path.string();
  }
  model.load_state_dict(ckpt::load_checkpoint_tensors(latest.path, "model").tensors, /*strict=*/true);
  return latest.path;
}

int export_hf(const std::string& run_dir, const std::string& out_dir, const std::string& checkpoint) {
  const std::string cfg_path = (fs::path(run_dir) / "config.yaml").string();
  ATH_CHECK(fs::exists(cfg_path), "export-hf", "'", cfg_path, "' does not exist",
            Hint{"RUN_DIR is a run directory written by `athanor train` (it holds config.yaml and checkpoints/)"});
  const train::Config c = train::Config::load(cfg_path);
  const std::string& type = c.get_string("model.type");
  ATH_CHECK(type == "gpt" || type == "llama", "export-hf", cfg_path, ": model.type is '", type,
            "'; only GPT models (to Hugging Face GPT-2) and Llama models (to LlamaForCausalLM) can be exported");
  ATH_CHECK(c.get_int("model.vocab_size") > 0, "export-hf", cfg_path, ": model.vocab_size is 0 (the tokenizer's, not resolved)",
            Hint{"set model.vocab_size in the run's config.yaml"});
  std::string source;
  if (type == "llama") {
    nn::Llama model(train::llama_config(c));
    source = load_run_weights(model, run_dir, checkpoint);
    ckpt::export_hf_llama(model, out_dir);
  } else {
    nn::GPT model(train::gpt_config(c));
    source = load_run_weights(model, run_dir, checkpoint);
    ckpt::export_hf_gpt2(model, out_dir);
  }
  std::cout << "exported " << source << " to " << out_dir << " (model.safetensors, config.json)\n";
  return 0;
}

int import_hf(const std::string& hf_dir, const std::string& out_file) {
  const std::string family = ckpt::hf_model_family((fs::path(hf_dir) / "config.json").string());
  if (family == "llama") {
    const ckpt::HfLlama hf = ckpt::import_hf_llama(hf_dir);
    const nn::LlamaConfig& g = hf.config;
    std::map<std::string, std::string> md = {{"source", hf_dir},
                                             {"model_type", "llama"},
                                             {"n_layer", std::to_string(g.n_layer)},
                                             {"n_head", std::to_string(g.n_head)},
                                             {"n_kv_head", std::to_string(g.n_kv_head)},
                                             {"n_embd", std::to_string(g.n_embd)},
                                             {"intermediate_size", std::to_string(g.intermediate_size)},
                                             {"block_size", std::to_string(g.block_size)},
                                             {"vocab_size", std::to_string(g.vocab_size)},
                                             {"rope_theta", std::to_string(g.rope_theta)},
                                             {"rms_norm_eps", std::to_string(g.rms_norm_eps)},
                                             {"tie_embeddings", g.tie_embeddings ? "true" : "false"},
                                             {"rope_scaling", g.rope_scaling ? "llama3" : "none"}};
    if (g.rope_scaling) {
      md["rope_factor"] = std::to_string(g.rope_scaling->factor);
      md["rope_low_freq_factor"] = std::to_string(g.rope_scaling->low_freq_factor);
      md["rope_high_freq_factor"] = std::to_string(g.rope_scaling->high_freq_factor);
      md["rope_original_max_position"] = std::to_string(g.rope_scaling->original_max_position);
    }
    ckpt::save_safetensors(out_file, hf.state, md);
    std::cout << "imported " << hf_dir << " (Llama, " << hf.state.size() << " tensors, n_layer " << g.n_layer << ", n_embd "
              << g.n_embd << ", n_head " << g.n_head << ", n_kv_head " << g.n_kv_head << ") to " << out_file << "\n";
    return 0;
  }
  const ckpt::HfGpt2 hf = ckpt::import_hf_gpt2(hf_dir);
  const nn::GPTConfig& g = hf.config;
  ckpt::save_safetensors(out_file, hf.state,
                         {{"source", hf_dir},
                          {"model_type", "gpt"},
                          {"n_layer", std::to_string(g.n_layer)},
                          {"n_head", std::to_string(g.n_head)},
                          {"n_embd", std::to_string(g.n_embd)},
                          {"block_size", std::to_string(g.block_size)},
                          {"vocab_size", std::to_string(g.vocab_size)}});
  std::cout << "imported " << hf_dir << " (GPT-2, " << hf.state.size() << " tensors, n_layer " << g.n_layer << ", n_embd "
            << g.n_embd << ") to " << out_file << "\n";
  return 0;
}

const bool export_registered = register_command(
    {"export-hf", "Export a run's GPT or Llama as a Hugging Face directory (model.safetensors + config.json)", [](CLI::App& sub) {
       auto run_dir = std::make_shared<std::string>();
       auto out_dir = std::make_shared<std::string>();
       auto checkpoint = std::make_shared<std::string>();
       sub.add_option("run_dir", *run_dir, "run directory (config.yaml; checkpoints/ or model.safetensors)")->required();
       sub.add_option("out_dir", *out_dir, "directory to write model.safetensors and config.json into")->required();
       sub.add_option("--checkpoint", *checkpoint, "a checkpoint directory to export instead of the run's newest weights");
       return [=] { return export_hf(*run_dir, *out_dir, *checkpoint); };
     }});

const bool import_registered = register_command(
    {"import-hf", "Convert a Hugging Face GPT-2 or Llama directory into an athanor safetensors file", [](CLI::App& sub) {
       auto hf_dir = std::make_shared<std::string>();
       auto out_file = std::make_shared<std::string>();
       sub.add_option("hf_dir", *hf_dir, "directory with config.json and model.safetensors")->required();
       sub.add_option("out_file", *out_file, "safetensors file to write (athanor names and layout)")->required();
       return [=] { return import_hf(*hf_dir, *out_file); };
     }});
}  // namespace

}  // namespace athanor::cli
