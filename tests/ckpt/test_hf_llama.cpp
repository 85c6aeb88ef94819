// Hugging Face Llama interop: export -> import is bit-exact and writes HF's LlamaConfig keys;
// the PyTorch fixture's weights (tools/make_llama_fixture.py, HF names) imported as a HF
// directory give the fixture's logits; bad directories are clear errors naming key and file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../ops/fixture_reader.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/ckpt/hf_llama.h"
#include "athanor/ckpt/safetensors.h"
#include "test_util.h"

namespace athanor {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::Fixture;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The safetensors header parsed here, without the library's reader.
json raw_header(const std::string& path) {
  const std::string all = slurp(path);
  uint64_t len = 0;
  std::memcpy(&len, all.data(), 8);
  return json::parse(all.substr(8, len));
}

nn::LlamaConfig small(bool tied, bool scaled) {
  nn::LlamaConfig c{.vocab_size = 37, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 16, .intermediate_size = 40,
                    .block_size = 32, .rope_theta = 500000.0, .rms_norm_eps = 1e-6, .tie_embeddings = tied};
  if (scaled) c.rope_scaling = RopeScaling{.factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_max_position = 8192};
  return c;
}

// A HF directory holding the fixture's weights (HF names, f64) and a config.json written here
// from transformers' documented LlamaConfig keys (not by the exporter under test).
std::string hf_dir_from_fixture(const std::string& name, const std::string& fixture,
                                const std::function<void(json&, ckpt::NamedTensors&)>& edit = {}) {
  const Fixture f = Fixture::load(testing::fixture_path(fixture));
  const auto& md = f.metadata();
  json cfg = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", std::stoll(md.at("vocab_size"))},
              {"hidden_size", std::stoll(md.at("n_embd"))},
              {"intermediate_size", std::stoll(md.at("intermediate_size"))},
              {"num_hidden_layers", std::stoll(md.at("n_layer"))},
              {"num_attention_heads", std::stoll(md.at("n_head"))},
              {"num_key_value_heads", std::stoll(md.at("n_kv_head"))},
              {"max_position_embeddings", std::stoll(md.at("max_position_embeddings"))},
              {"rms_norm_eps", std::stod(md.at("rms_norm_eps"))},
              {"rope_theta", std::stod(md.at("rope_theta"))},
              {"hidden_act", "silu"},
              {"attention_bias", false},
              {"tie_word_embeddings", md.at("tie_word_embeddings") == "true"},
              {"torch_dtype", "float64"}};
  if (md.count("rope_scaling.factor"))
    cfg["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", std::stod(md.at("rope_scaling.factor"))},
                           {"low_freq_factor", std::stod(md.at("rope_scaling.low_freq_factor"))},
                           {"high_freq_factor", std::stod(md.at("rope_scaling.high_freq_factor"))},
                           {"original_max_position_embeddings", std::stoll(md.at("rope_scaling.original_max_position_embeddings"))}};
  ckpt::NamedTensors weights;
  for (const auto& n : f.names())
    if (n.rfind("model.", 0) == 0 || n == "lm_head.weight") weights.emplace_back(n, f.get(n));
  if (edit) edit(cfg, weights);
  const std::string dir = testing::fresh_temp_dir(name);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  ckpt::save_safetensors(dir + "/model.safetensors", weights, {{"format", "pt"}});
  return dir;
}

std::string import_error(const std::string& dir) { return testing::error_message([&] { ckpt::import_hf_llama(dir); }); }

TEST(HfLlama, ExportThenImportIsBitExactWithHfKeys) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    manual_seed(3);
    nn::Llama model(small(tied, /*scaled=*/!tied));
    const std::string dir = testing::fresh_temp_dir(tied ? "hf_llama_rt_tied" : "hf_llama_rt");
    ckpt::export_hf_llama(model, dir);

    // The file, read without the library: HF's names, F32, the model's bytes.
    const json header = raw_header(dir + "/model.safetensors");
    const auto sd = model.state_dict();
    EXPECT_EQ(header.size(), sd.size() + 1);  // + __metadata__
    EXPECT_EQ(header.contains("lm_head.weight"), !tied);
    for (const auto& [name, t] : sd) {
      ASSERT_TRUE(header.contains(name)) << name;
      EXPECT_EQ(header[name]["dtype"], "F32") << name;
    }

    const json cfg = json::parse(slurp(dir + "/config.json"));
    EXPECT_EQ(cfg["architectures"], json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(cfg["model_type"], "llama");
    EXPECT_EQ(cfg["hidden_size"], 16);
    EXPECT_EQ(cfg["intermediate_size"], 40);
    EXPECT_EQ(cfg["num_hidden_layers"], 2);
    EXPECT_EQ(cfg["num_attention_heads"], 4);
    EXPECT_EQ(cfg["num_key_value_heads"], 2);
    EXPECT_EQ(cfg["head_dim"], 4);
    EXPECT_EQ(cfg["rms_norm_eps"], 1e-6);
    EXPECT_EQ(cfg["rope_theta"], 500000.0);
    EXPECT_EQ(cfg["max_position_embeddings"], 32);
    EXPECT_EQ(cfg["vocab_size"], 37);
    EXPECT_EQ(cfg["tie_word_embeddings"], tied);
    EXPECT_EQ(cfg["torch_dtype"], "float32");
    EXPECT_EQ(cfg["hidden_act"], "silu");
    EXPECT_EQ(cfg["attention_bias"], false);
    EXPECT_EQ(cfg["mlp_bias"], false);
    if (tied) {
      EXPECT_TRUE(cfg["rope_scaling"].is_null());
    } else {
      EXPECT_EQ(cfg["rope_scaling"]["rope_type"], "llama3");
      EXPECT_EQ(cfg["rope_scaling"]["factor"], 8.0);
      EXPECT_EQ(cfg["rope_scaling"]["original_max_position_embeddings"], 8192);
    }

    const ckpt::HfLlama back = ckpt::import_hf_llama(dir);
    ASSERT_EQ(back.state.size(), sd.size());
    for (size_t i = 0; i < sd.size(); ++i) {
      EXPECT_EQ(back.state[i].first, sd[i].first);
      EXPECT_EQ(athanor::testing::tensor_bytes(back.state[i].second), athanor::testing::tensor_bytes(sd[i].second)) << sd[i].first;
    }
    EXPECT_EQ(back.config.n_kv_head, 2);
    EXPECT_EQ(back.config.tie_embeddings, tied);
    EXPECT_EQ(back.config.rope_scaling.has_value(), !tied);
    EXPECT_EQ(back.config.rms_norm_eps, 1e-6);
  }
}

TEST(HfLlama, ImportOfThePyTorchFixtureGivesItsLogits) {
  for (const std::string fx : {"llama_tiny.safetensors", "llama_tiny_rope_llama3.safetensors", "llama_tiny_tied.safetensors"}) {
    SCOPED_TRACE(fx);
    const std::string dir = hf_dir_from_fixture("hf_llama_fx", fx);
    auto model = ckpt::load_hf_llama(dir);  // weights converted to f32
    const Fixture f = Fixture::load(testing::fixture_path(fx));
    NoGradGuard ng;
    Tensor logits = model->forward(f.get("ids"));
    EXPECT_EQ(logits.dtype(), DType::f32);
    EXPECT_CLOSE(logits, f.get("logits"), 2e-5, 1e-4);
  }
}

TEST(HfLlama, BadDirectoriesAreClearErrorsNamingKeyAndFile) {
  const std::string fx = "llama_tiny.safetensors";
  auto drop = [](const std::string& name) {
    return [name](json&, ckpt::NamedTensors& w) {
      for (auto it = w.begin(); it != w.end(); ++it)
        if (it->first == name) { w.erase(it); return; }
      FAIL() << name << " not in the fixture";
    };
  };
  std::string e = import_error(hf_dir_from_fixture("hf_llama_missing", fx, drop("model.layers.1.mlp.up_proj.weight")));
  EXPECT_NE(e.find("missing tensor 'model.layers.1.mlp.up_proj.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;

  e = import_error(hf_dir_from_fixture("hf_llama_extra", fx, [](json&, ckpt::NamedTensors& w) {
    w.emplace_back("model.layers.0.self_attn.q_proj.bias", zeros({32}, DType::f64));
  }));
  EXPECT_NE(e.find("unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;

  e = import_error(hf_dir_from_fixture("hf_llama_shape", fx, [](json& c, ckpt::NamedTensors&) { c["num_key_value_heads"] = 4; }));
  EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 32]"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json implies [32, 32]"), std::string::npos) << e;

  e = import_error(hf_dir_from_fixture("hf_llama_bias", fx, [](json& c, ckpt::NamedTensors&) { c["attention_bias"] = true; }));
  EXPECT_NE(e.find("config.json: attention_bias true is not supported"), std::string::npos) << e;

  e = import_error(hf_dir_from_fixture("hf_llama_yarn", fx, [](json& c, ckpt::NamedTensors&) {
    c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  }));
  EXPECT_NE(e.find("config.json: rope_scaling type \"yarn\" is not supported"), std::string::npos) << e;

  e = import_error(hf_dir_from_fixture("hf_llama_kv", fx, [](json& c, ckpt::NamedTensors&) { c["num_key_value_heads"] = 3; }));
  EXPECT_NE(e.find("num_key_value_heads 3 does not divide num_attention_heads 4"), std::string::npos) << e;

  e = import_error(hf_dir_from_fixture("hf_llama_nokey", fx, [](json& c, ckpt::NamedTensors&) { c.erase("intermediate_size"); }));
  EXPECT_NE(e.find("config.json: missing key 'intermediate_size'"), std::string::npos) << e;

  e = import_error(hf_dir_from_fixture("hf_llama_act", fx, [](json& c, ckpt::NamedTensors&) { c["hidden_act"] = "gelu"; }));
  EXPECT_NE(e.find("hidden_act \"gelu\" is not supported"), std::string::npos) << e;

  // Tied in the config but a different lm_head in the file.
  e = import_error(hf_dir_from_fixture("hf_llama_tie", fx, [](json& c, ckpt::NamedTensors&) { c["tie_word_embeddings"] = true; }));
  EXPECT_NE(e.find("lm_head.weight differs from model.embed_tokens.weight"), std::string::npos) << e;

  // The family, from model_type or architectures.
  const std::string d = testing::fresh_temp_dir("hf_family");
  std::ofstream(d + "/config.json") << R"({"model_type": "mistral", "architectures": ["MistralForCausalLM"]})";
  e = testing::error_message([&] { ckpt::hf_model_family(d + "/config.json"); });
  EXPECT_NE(e.find("model_type \"mistral\" is not a family athanor imports"), std::string::npos) << e;
  std::ofstream(d + "/config.json") << R"({"architectures": ["LlamaForCausalLM"]})";
  EXPECT_EQ(ckpt::hf_model_family(d + "/config.json"), "llama");
  std::ofstream(d + "/config.json") << R"({"model_type": "gpt2"})";
  EXPECT_EQ(ckpt::hf_model_family(d + "/config.json"), "gpt2");
}

}  // namespace
}  // namespace athanor
