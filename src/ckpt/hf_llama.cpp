#include "athanor/ckpt/hf_llama.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "athanor/autograd/grad_mode.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/core/error.h"

namespace athanor::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kOp = "import_hf_llama";

json read_json(const std::string& path, const char* op) {
  std::ifstream f(path);
  ATH_CHECK(f.good(), op, "cannot open '", path, "'",
            Hint{"a Hugging Face model directory holds config.json and model.safetensors"});
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    ATH_FAIL(op, path, ": not valid JSON (", e.what(), ")");
  }
}

int64_t positive_int(const json& cfg, const std::string& path, const char* key, std::optional<int64_t> fallback = std::nullopt) {
  if (!cfg.contains(key) || cfg[key].is_null()) {
    ATH_CHECK(fallback.has_value(), kOp, path, ": missing key '", key, "'", Hint{"a LlamaConfig names " + std::string(key)});
    return *fallback;
  }
  ATH_CHECK(cfg[key].is_number_integer() && cfg[key].get<int64_t>() > 0, kOp, path, ": '", key,
            "' must be a positive integer, got ", cfg[key].dump());
  return cfg[key].get<int64_t>();
}

double number(const json& cfg, const std::string& path, const char* key, double fallback) {
  if (!cfg.contains(key) || cfg[key].is_null()) return fallback;
  ATH_CHECK(cfg[key].is_number(), kOp, path, ": '", key, "' must be a number, got ", cfg[key].dump());
  return cfg[key].get<double>();
}

bool boolean(const json& cfg, const std::string& path, const char* key, bool fallback) {
  if (!cfg.contains(key) || cfg[key].is_null()) return fallback;
  ATH_CHECK(cfg[key].is_boolean(), kOp, path, ": '", key, "' must be true or false, got ", cfg[key].dump());
  return cfg[key].get<bool>();
}

nn::LlamaConfig parse_config(const json& cfg, const std::string& path) {
  ATH_CHECK(cfg.is_object(), kOp, path, ": the config must be a JSON object");
  if (cfg.contains("model_type"))
    ATH_CHECK(cfg["model_type"] == "llama", kOp, path, ": model_type is ", cfg["model_type"].dump(), ", not \"llama\"",
              Hint{"only Llama checkpoints (LlamaForCausalLM) can be imported as a Llama"});
  nn::LlamaConfig c;
  // transformers' LlamaConfig defaults where a key may be left out.
  c.vocab_size = positive_int(cfg, path, "vocab_size");
  c.n_embd = positive_int(cfg, path, "hidden_size");
  c.intermediate_size = positive_int(cfg, path, "intermediate_size");
  c.n_layer = positive_int(cfg, path, "num_hidden_layers");
  c.n_head = positive_int(cfg, path, "num_attention_heads");
  c.n_kv_head = positive_int(cfg, path, "num_key_value_heads", c.n_head);
  c.block_size = positive_int(cfg, path, "max_position_embeddings", 2048);
  c.rms_norm_eps = number(cfg, path, "rms_norm_eps", 1e-6);
  c.rope_theta = number(cfg, path, "rope_theta", 10000.0);
  c.tie_embeddings = boolean(cfg, path, "tie_word_embeddings", false);
  c.initializer_range = number(cfg, path, "initializer_range", 0.02);

  ATH_CHECK(c.n_embd % c.n_head == 0, kOp, path, ": hidden_size ", c.n_embd, " is not divisible by num_attention_heads ", c.n_head);
  if (cfg.contains("head_dim") && !cfg["head_dim"].is_null()) {
    const int64_t hd = positive_int(cfg, path, "head_dim");
    ATH_CHECK(hd == c.n_embd / c.n_head, kOp, path, ": head_dim ", hd, " is not hidden_size / num_attention_heads = ",
              c.n_embd / c.n_head, " (not supported)",
              Hint{"athanor's Llama projects to num_attention_heads x (hidden_size / num_attention_heads)"});
  }
  ATH_CHECK(c.n_head % c.n_kv_head == 0, kOp, path, ": num_key_value_heads ", c.n_kv_head, " does not divide num_attention_heads ",
            c.n_head);
  if (cfg.contains("hidden_act"))
    ATH_CHECK(cfg["hidden_act"] == "silu", kOp, path, ": hidden_act ", cfg["hidden_act"].dump(), " is not supported",
              Hint{"athanor's Llama MLP is SwiGLU: silu(gate_proj(x)) * up_proj(x)"});
  ATH_CHECK(!boolean(cfg, path, "attention_bias", false), kOp, path,
            ": attention_bias true is not supported (q/k/v/o_proj with biases)", Hint{"athanor's Llama has no biases"});
  ATH_CHECK(!boolean(cfg, path, "mlp_bias", false), kOp, path, ": mlp_bias true is not supported", Hint{"athanor's Llama has no biases"});
  const double attn_drop = number(cfg, path, "attention_dropout", 0.0);
  ATH_CHECK(attn_drop == 0.0, kOp, path, ": attention_dropout ", attn_drop, " is not supported",
            Hint{"athanor's Llama has no dropout on attention probabilities; set it to 0.0 (training dropout is athanor's model.dropout)"});
  if (cfg.contains("rope_scaling") && !cfg["rope_scaling"].is_null()) {
    const json& s = cfg["rope_scaling"];
    ATH_CHECK(s.is_object(), kOp, path, ": 'rope_scaling' must be an object or null, got ", s.dump());
    std::string type = "default";
    for (const char* k : {"rope_type", "type"})  // "type" is the older spelling
      if (s.contains(k) && s[k].is_string()) type = s[k].get<std::string>();
    ATH_CHECK(type == "default" || type == "llama3", kOp, path, ": rope_scaling type \"", type, "\" is not supported",
              Hint{"athanor supports rope_scaling null, \"default\" and Llama 3.1's \"llama3\""});
    if (type == "llama3") {
      RopeScaling r;
      for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        ATH_CHECK(s.contains(k) && s[k].is_number(), kOp, path, ": rope_scaling \"llama3\" needs a number '", k, "'");
      r.factor = s["factor"].get<double>();
      r.low_freq_factor = s["low_freq_factor"].get<double>();
      r.high_freq_factor = s["high_freq_factor"].get<double>();
      r.original_max_position = s["original_max_position_embeddings"].get<int64_t>();
      c.rope_scaling = r;
    }
  }
  const std::string problem = nn::llama_config_problem(c);
  ATH_CHECK(problem.empty(), kOp, path, ": ", problem);
  return c;
}

// The rotary inverse-frequency buffers older transformers versions saved with the weights.
bool is_ignored_buffer(const std::string& name) {
  const std::string tail = ".self_attn.rotary_emb.inv_freq";
  return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

Tensor as_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : t.to(DType::f32); }
}  // namespace

std::string hf_llama_config_json(const nn::LlamaConfig& c) {
  json scaling = nullptr;
  if (c.rope_scaling) {
    scaling = {{"rope_type", "llama3"},
               {"factor", c.rope_scaling->factor},
               {"low_freq_factor", c.rope_scaling->low_freq_factor},
               {"high_freq_factor", c.rope_scaling->high_freq_factor},
               {"original_max_position_embeddings", c.rope_scaling->original_max_position}};
  }
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.n_embd},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.n_layer},
            {"num_attention_heads", c.n_head},
            {"num_key_value_heads", c.n_kv_head},
            {"head_dim", c.head_dim()},
            {"hidden_act", "silu"},
            {"max_position_embeddings", c.block_size},
            {"initializer_range", c.initializer_range},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"rope_scaling", scaling},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"mlp_bias", false},
            {"pretraining_tp", 1},
            {"tie_word_embeddings", c.tie_embeddings},
            {"use_cache", true},
            // athanor's tokenizers (byte, GPT-2 BPE) have no Llama BOS/EOS ids
            {"bos_token_id", nullptr},
            {"eos_token_id", nullptr},
            {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

void export_hf_llama(const nn::Llama& model, const std::string& out_dir) {
  const char* op = "export_hf_llama";
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  ATH_CHECK(!ec, op, "cannot create '", out_dir, "': ", ec.message());
  NoGradGuard ng;
  NamedTensors out;
  for (const auto& [name, t] : model.state_dict()) {
    ATH_CHECK(is_floating(t.dtype()), op, "tensor '", name, "' has dtype ", dtype_name(t.dtype()), ", not floating");
    out.emplace_back(name, as_f32(t.detach()).contiguous());
  }
  save_safetensors((fs::path(out_dir) / "model.safetensors").string(), out, {{"format", "pt"}});

  const std::string cfg_path = (fs::path(out_dir) / "config.json").string();
  const std::string tmp = cfg_path + ".tmp";
  {
    std::ofstream f(tmp);
    f << hf_llama_config_json(model.config());
    f.flush();
    ATH_CHECK(f.good(), op, "cannot write '", tmp, "'", Hint{"check free disk space and permissions"});
  }
  fs::rename(tmp, cfg_path, ec);
  ATH_CHECK(!ec, op, "cannot rename ", tmp, " to ", cfg_path, ": ", ec.message());
}

HfLlama import_hf_llama(const std::string& dir) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const std::string st_path = (fs::path(dir) / "model.safetensors").string();
  HfLlama out;
  out.config = parse_config(read_json(cfg_path, kOp), cfg_path);
  ATH_CHECK(fs::exists(st_path), kOp, "'", st_path, "' does not exist",
            Hint{"sharded checkpoints (model-00001-of-0000N.safetensors) and pytorch_model.bin are not supported"});
  const SafetensorsFile file = load_safetensors(st_path);

  // The names and shapes athanor's Llama expects, in its state_dict order (src/nn/llama.cpp).
  const nn::LlamaConfig& c = out.config;
  const int64_t D = c.n_embd, hd = c.head_dim(), I = c.intermediate_size;
  std::vector<std::pair<std::string, Shape>> want = {{"model.embed_tokens.weight", {c.vocab_size, D}}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    want.push_back({p + "self_attn.q_proj.weight", {c.n_head * hd, D}});
    want.push_back({p + "self_attn.k_proj.weight", {c.n_kv_head * hd, D}});
    want.push_back({p + "self_attn.v_proj.weight", {c.n_kv_head * hd, D}});
    want.push_back({p + "self_attn.o_proj.weight", {D, c.n_head * hd}});
    want.push_back({p + "mlp.gate_proj.weight", {I, D}});
    want.push_back({p + "mlp.up_proj.weight", {I, D}});
    want.push_back({p + "mlp.down_proj.weight", {D, I}});
    want.push_back({p + "input_layernorm.weight", {D}});
    want.push_back({p + "post_attention_layernorm.weight", {D}});
  }
  want.push_back({"model.norm.weight", {D}});
  if (!c.tie_embeddings) want.push_back({"lm_head.weight", {c.vocab_size, D}});
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : file.tensors) by_name.emplace(name, &t);
  std::set<std::string> used;
  NoGradGuard ng;
  for (const auto& [name, shape] : want) {
    auto it = by_name.find(name);
    ATH_CHECK(it != by_name.end(), kOp, st_path, ": missing tensor '", name, "'",
              Hint{"the file is not a complete Llama of the shape " + cfg_path + " describes"});
    used.insert(name);
    const Tensor& src = *it->second;
    ATH_CHECK(is_floating(src.dtype()), kOp, st_path, ": tensor '", name, "' has dtype ", dtype_name(src.dtype()),
              ", expected a floating type");
    ATH_CHECK(src.sizes() == shape, kOp, st_path, ": tensor '", name, "' has shape ", shape_str(src.sizes()), " but ",
              cfg_path, " implies ", shape_str(shape), Hint{"config.json and model.safetensors do not belong together"});
    Tensor v = as_f32(src);
    if (v.dtype() == src.dtype()) v = v.clone();  // own the memory: a view would keep the file's map alive
    out.state.emplace_back(name, v.detach());
  }
  for (const auto& [name, t] : by_name) {
    if (used.count(name) || is_ignored_buffer(name)) continue;
    if (name == "lm_head.weight" && out.config.tie_embeddings) {
      // Tied in the config, but written anyway (some exporters do): it must be the embedding.
      const Tensor& emb = out.state.front().second;
      Tensor h = as_f32(*t).contiguous();
      ATH_CHECK(h.sizes() == emb.sizes() && std::memcmp(h.raw_data(), emb.raw_data(), emb.nbytes()) == 0, kOp, st_path,
                ": lm_head.weight differs from model.embed_tokens.weight but ", cfg_path, " says tie_word_embeddings true",
                Hint{"set tie_word_embeddings false in config.json to import an untied head"});
      continue;
    }
    ATH_FAIL(kOp, st_path, ": unexpected tensor '", name, "' ", shape_str(t->sizes()),
             Hint{"the file holds more than a Llama of the shape " + cfg_path + " describes" +
                  (name == "lm_head.weight" ? " (tie_word_embeddings is true there)" : "")});
  }
  return out;
}

std::shared_ptr<nn::Llama> load_hf_llama(const std::string& dir) {
  HfLlama hf = import_hf_llama(dir);
  auto model = std::make_shared<nn::Llama>(hf.config);
  model->load_state_dict(hf.state, /*strict=*/true);
  return model;
}

std::string hf_model_family(const std::string& path) {
  const char* op = "import-hf";
  const json cfg = read_json(path, op);
  ATH_CHECK(cfg.is_object(), op, path, ": the config must be a JSON object");
  std::string found;
  if (cfg.contains("model_type") && cfg["model_type"].is_string()) {
    found = "model_type \"" + cfg["model_type"].get<std::string>() + "\"";
    if (cfg["model_type"] == "gpt2") return "gpt2";
    if (cfg["model_type"] == "llama") return "llama";
  } else if (cfg.contains("architectures") && cfg["architectures"].is_array()) {
    found = "architectures " + cfg["architectures"].dump();
    for (const auto& a : cfg["architectures"]) {
      if (a == "GPT2LMHeadModel") return "gpt2";
      if (a == "LlamaForCausalLM") return "llama";
    }
  } else {
    found = "neither model_type nor architectures";
  }
  ATH_FAIL(op, path, ": ", found, " is not a family athanor imports",
           Hint{"athanor imports GPT-2 (model_type \"gpt2\", GPT2LMHeadModel) and Llama (\"llama\", LlamaForCausalLM)"});
}

}  // namespace athanor::ckpt
