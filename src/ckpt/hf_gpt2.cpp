#include "athanor/ckpt/hf_gpt2.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "athanor/autograd/grad_mode.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/core/error.h"

namespace athanor::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kPrefix = "transformer.";
constexpr double kLayerNormEps = 1e-5;  // athanor's GPT LayerNorms (src/nn/gpt.cpp)

// HF's Conv1D weights, stored [in, out]: the transpose of athanor's Linear.
bool is_conv1d_weight(const std::string& name) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends_with(".attn.c_attn.weight") || ends_with(".attn.c_proj.weight") || ends_with(".mlp.c_fc.weight") ||
         ends_with(".mlp.c_proj.weight");
}

// Buffers HF GPT-2 files may carry that athanor's GPT rebuilds itself (the causal mask).
bool is_ignored_buffer(const std::string& name) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

Tensor transposed_copy(const Tensor& t) { return t.t().contiguous(); }

json read_json(const std::string& path) {
  std::ifstream f(path);
  ATH_CHECK(f.good(), "import_hf_gpt2", "cannot open '", path, "'",
            Hint{"a Hugging Face GPT-2 directory holds config.json and model.safetensors"});
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    ATH_FAIL("import_hf_gpt2", path, ": not valid JSON (", e.what(), ")");
  }
}

int64_t int_key(const json& cfg, const std::string& path, const char* key) {
  ATH_CHECK(cfg.contains(key), "import_hf_gpt2", path, ": missing key '", key, "'");
  ATH_CHECK(cfg[key].is_number_integer() && cfg[key].get<int64_t>() > 0, "import_hf_gpt2", path, ": '", key,
            "' must be a positive integer, got ", cfg[key].dump());
  return cfg[key].get<int64_t>();
}

double number_or(const json& cfg, const std::string& path, const char* key, double fallback) {
  if (!cfg.contains(key) || cfg[key].is_null()) return fallback;
  ATH_CHECK(cfg[key].is_number(), "import_hf_gpt2", path, ": '", key, "' must be a number, got ", cfg[key].dump());
  return cfg[key].get<double>();
}

bool flag_set(const json& cfg, const char* key) { return cfg.contains(key) && cfg[key].is_boolean() && cfg[key].get<bool>(); }

nn::GPTConfig parse_config(const json& cfg, const std::string& path) {
  const char* op = "import_hf_gpt2";
  ATH_CHECK(cfg.is_object(), op, path, ": the config must be a JSON object");
  if (cfg.contains("model_type"))
    ATH_CHECK(cfg["model_type"] == "gpt2", op, path, ": model_type is ", cfg["model_type"].dump(), ", not \"gpt2\"",
              Hint{"only GPT-2 checkpoints can be imported"});
  nn::GPTConfig c;
  c.vocab_size = int_key(cfg, path, "vocab_size");
  c.n_embd = int_key(cfg, path, "n_embd");
  c.n_layer = int_key(cfg, path, "n_layer");
  c.n_head = int_key(cfg, path, "n_head");
  c.block_size = cfg.contains("n_positions") ? int_key(cfg, path, "n_positions") : int_key(cfg, path, "n_ctx");
  ATH_CHECK(c.n_embd % c.n_head == 0, op, path, ": n_embd ", c.n_embd, " is not divisible by n_head ", c.n_head);
  c.bias = true;  // HF GPT-2 always has biases

  std::string act = "gelu_new";
  if (cfg.contains("activation_function")) {
    ATH_CHECK(cfg["activation_function"].is_string(), op, path, ": activation_function must be a string");
    act = cfg["activation_function"].get<std::string>();
  }
  ATH_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", op, path, ": activation_function \"", act, "\" is not supported",
            Hint{"athanor's GPT uses the tanh GELU (\"gelu_new\"); other activations would give different logits"});
  if (cfg.contains("n_inner") && !cfg["n_inner"].is_null()) {
    ATH_CHECK(cfg["n_inner"].is_number_integer() && cfg["n_inner"].get<int64_t>() == 4 * c.n_embd, op, path, ": n_inner ",
              cfg["n_inner"].dump(), " is not 4*n_embd = ", 4 * c.n_embd, Hint{"athanor's GPT has an MLP of width 4*n_embd"});
  }
  const double eps = number_or(cfg, path, "layer_norm_epsilon", kLayerNormEps);
  ATH_CHECK(std::abs(eps - kLayerNormEps) <= 1e-12, op, path, ": layer_norm_epsilon ", eps, " is not supported",
            Hint{"athanor's GPT uses LayerNorm eps 1e-5"});
  ATH_CHECK(!flag_set(cfg, "scale_attn_by_inverse_layer_idx"), op, path,
            ": scale_attn_by_inverse_layer_idx = true is not supported", Hint{"athanor's GPT scales attention by 1/sqrt(head_dim) only"});
  ATH_CHECK(!flag_set(cfg, "reorder_and_upcast_attn"), op, path, ": reorder_and_upcast_attn = true is not supported");
  if (cfg.contains("scale_attn_weights"))
    ATH_CHECK(cfg["scale_attn_weights"] == true, op, path, ": scale_attn_weights = false is not supported");
  if (cfg.contains("add_cross_attention"))
    ATH_CHECK(cfg["add_cross_attention"] != true, op, path, ": add_cross_attention = true is not supported");

  const double resid = number_or(cfg, path, "resid_pdrop", 0.1);
  const double embd = number_or(cfg, path, "embd_pdrop", resid);
  const double attn = number_or(cfg, path, "attn_pdrop", resid);
  ATH_CHECK(resid == embd && resid == attn, op, path, ": resid_pdrop ", resid, ", embd_pdrop ", embd, " and attn_pdrop ", attn,
            " differ", Hint{"athanor's GPT has one dropout rate; set the three to the same value"});
  c.dropout = resid;
  return c;
}

void expect_shape(const Tensor& t, const Shape& want, const std::string& file, const std::string& name) {
  ATH_CHECK(t.sizes() == want, "import_hf_gpt2", file, ": tensor '", name, "' has shape ", shape_str(t.sizes()),
            " but config.json implies ", shape_str(want), Hint{"config.json and model.safetensors do not belong together"});
}
}  // namespace

std::string hf_gpt2_config_json(const nn::GPTConfig& c) {
  json j = {{"model_type", "gpt2"},
            {"architectures", {"GPT2LMHeadModel"}},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.block_size},
            {"n_ctx", c.block_size},
            {"n_embd", c.n_embd},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", kLayerNormEps},
            {"resid_pdrop", c.dropout},
            {"embd_pdrop", c.dropout},
            {"attn_pdrop", c.dropout},
            {"initializer_range", 0.02},
            {"scale_attn_weights", true},
            {"scale_attn_by_inverse_layer_idx", false},
            {"reorder_and_upcast_attn", false},
            {"use_cache", true},
            {"bos_token_id", 50256},
            {"eos_token_id", 50256},
            {"tie_word_embeddings", true},
            {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

void export_hf_gpt2(const nn::GPT& model, const std::string& out_dir) {
  const nn::GPTConfig& c = model.config();
  ATH_CHECK(c.bias, "export_hf_gpt2", "the model has bias = false; Hugging Face GPT-2 always has biases",
            Hint{"export a model built with bias: true"});
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  ATH_CHECK(!ec, "export_hf_gpt2", "cannot create '", out_dir, "': ", ec.message());
  NoGradGuard ng;
  NamedTensors out;
  for (const auto& [name, t] : model.state_dict()) {
    if (is_ignored_buffer(name)) continue;
    ATH_CHECK(t.dtype() == DType::f32 || is_floating(t.dtype()), "export_hf_gpt2", "tensor '", name, "' has dtype ",
              dtype_name(t.dtype()), ", not floating");
    Tensor v = t.dtype() == DType::f32 ? t.detach() : t.detach().to(DType::f32);
    out.emplace_back(name, is_conv1d_weight(name) ? transposed_copy(v) : v.contiguous());
  }
  save_safetensors((fs::path(out_dir) / "model.safetensors").string(), out, {{"format", "pt"}});

  const std::string cfg_path = (fs::path(out_dir) / "config.json").string();
  const std::string tmp = cfg_path + ".tmp";
  {
    std::ofstream f(tmp);
    f << hf_gpt2_config_json(c);
    f.flush();
    ATH_CHECK(f.good(), "export_hf_gpt2", "cannot write '", tmp, "'", Hint{"check free disk space and permissions"});
  }
  fs::rename(tmp, cfg_path, ec);
  ATH_CHECK(!ec, "export_hf_gpt2", "cannot rename ", tmp, " to ", cfg_path, ": ", ec.message());
}

HfGpt2 import_hf_gpt2(const std::string& dir) {
  const char* op = "import_hf_gpt2";
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const std::string st_path = (fs::path(dir) / "model.safetensors").string();
  HfGpt2 out;
  out.config = parse_config(read_json(cfg_path), cfg_path);
  const nn::GPTConfig& c = out.config;
  ATH_CHECK(fs::exists(st_path), op, "'", st_path, "' does not exist",
            Hint{"sharded checkpoints (model-00001-of-0000N.safetensors) and pytorch_model.bin are not supported"});
  const SafetensorsFile file = load_safetensors(st_path);

  // The names athanor's GPT expects and their shapes in athanor's layout.
  const int64_t D = c.n_embd;
  std::vector<std::pair<std::string, Shape>> want = {{"wte.weight", {c.vocab_size, D}}, {"wpe.weight", {c.block_size, D}}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    // GPT's registration order (its state_dict order): ln_1, attn, ln_2, mlp.
    want.push_back({p + "ln_1.weight", {D}});
    want.push_back({p + "ln_1.bias", {D}});
    want.push_back({p + "attn.c_attn.weight", {3 * D, D}});
    want.push_back({p + "attn.c_attn.bias", {3 * D}});
    want.push_back({p + "attn.c_proj.weight", {D, D}});
    want.push_back({p + "attn.c_proj.bias", {D}});
    want.push_back({p + "ln_2.weight", {D}});
    want.push_back({p + "ln_2.bias", {D}});
    want.push_back({p + "mlp.c_fc.weight", {4 * D, D}});
    want.push_back({p + "mlp.c_fc.bias", {4 * D}});
    want.push_back({p + "mlp.c_proj.weight", {D, 4 * D}});
    want.push_back({p + "mlp.c_proj.bias", {D}});
  }
  want.push_back({"ln_f.weight", {D}});
  want.push_back({"ln_f.bias", {D}});

  // File names without the optional prefix -> tensor.
  std::map<std::string, const Tensor*> by_name;
  const Tensor* lm_head = nullptr;
  for (const auto& [name, t] : file.tensors) {
    if (name == "lm_head.weight") {
      lm_head = &t;
      continue;
    }
    const std::string key = name.rfind(kPrefix, 0) == 0 ? name.substr(std::strlen(kPrefix)) : name;
    ATH_CHECK(by_name.emplace(key, &t).second, op, st_path, ": tensor '", key, "' appears both with and without the '",
              kPrefix, "' prefix");
  }
  std::set<std::string> used;
  NoGradGuard ng;
  for (const auto& [key, shape] : want) {
    auto it = by_name.find(key);
    ATH_CHECK(it != by_name.end(), op, st_path, ": missing tensor '", key, "' (or '", kPrefix, key, "')",
              Hint{"the file is not a complete GPT-2 of the shape config.json describes"});
    used.insert(key);
    const Tensor& src = *it->second;
    ATH_CHECK(is_floating(src.dtype()), op, st_path, ": tensor '", key, "' has dtype ", dtype_name(src.dtype()),
              ", expected a floating type");
    Tensor v = src.dtype() == DType::f32 ? src : src.to(DType::f32);
    if (is_conv1d_weight("." + key)) {
      // Stored [in, out]: check against the transpose of athanor's shape, then transpose.
      expect_shape(v, Shape{shape[1], shape[0]}, st_path, key);
      v = transposed_copy(v);
    } else {
      expect_shape(v, shape, st_path, key);
      // Own the memory: a tensor viewing a memory-mapped file keeps the whole map alive.
      if (v.dtype() == src.dtype()) v = v.clone();
    }
    out.state.emplace_back(kPrefix + key, v.detach());
  }
  for (const auto& [key, t] : by_name) {
    ATH_CHECK(used.count(key) || is_ignored_buffer("." + key), op, st_path, ": unexpected tensor '", key, "' ",
              shape_str(t->sizes()), Hint{"the file holds more than a GPT-2 of the shape config.json describes"});
  }
  if (lm_head) {
    // Tied to wte in GPT-2; athanor has no separate head, so it must be a copy.
    const Tensor& wte = out.state.front().second;
    Tensor h = lm_head->dtype() == DType::f32 ? *lm_head : lm_head->to(DType::f32);
    ATH_CHECK(h.sizes() == wte.sizes() && std::memcmp(h.contiguous().raw_data(), wte.raw_data(), wte.nbytes()) == 0, op,
              st_path, ": lm_head.weight differs from wte.weight", Hint{"athanor's GPT ties the output head to wte; untied heads are not supported"});
  }
  return out;
}

std::shared_ptr<nn::GPT> load_hf_gpt2(const std::string& dir) {
  HfGpt2 hf = import_hf_gpt2(dir);
  auto model = std::make_shared<nn::GPT>(hf.config);
  model->load_state_dict(hf.state, /*strict=*/true);
  return model;
}

}  // namespace athanor::ckpt
