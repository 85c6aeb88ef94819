// Hugging Face GPT-2 interop against tests/fixtures/hf_gpt2 (tools/make_hf_gpt2_fixture.py:
// a PyTorch re-implementation of HF's modeling_gpt2 with Conv1D weights [in, out],
// saved with Hub-style names and its logits).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "athanor/autograd/grad_mode.h"
#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/hf_gpt2.h"
#include "athanor/ckpt/safetensors.h"
#include "test_util.h"

namespace athanor {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixture = std::string(ATHANOR_FIXTURES_DIR) + "/hf_gpt2";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The JSON header and the data block of a safetensors file, parsed here without
// the library's reader (an independent check of the layout the exporter writes).
struct RawSafetensors {
  json header;
  std::string data;
  std::string bytes_of(const std::string& name) const {
    const auto& off = header.at(name).at("data_offsets");
    return data.substr(off[0].get<size_t>(), off[1].get<size_t>() - off[0].get<size_t>());
  }
};
RawSafetensors read_raw(const std::string& path) {
  const std::string all = slurp(path);
  uint64_t len = 0;
  std::memcpy(&len, all.data(), 8);
  return {json::parse(all.substr(8, len)), all.substr(8 + len)};
}

// A copy of the fixture directory whose config.json is edited by `edit`.
std::string fixture_copy(const std::string& name, const std::function<void(json&)>& edit) {
  const std::string dir = testing::fresh_temp_dir(name);
  fs::copy_file(kFixture + "/model.safetensors", dir + "/model.safetensors");
  json cfg = json::parse(slurp(kFixture + "/config.json"));
  edit(cfg);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  return dir;
}

// A copy of the fixture whose tensors are rewritten by `edit` (HF names, HF layout).
std::string fixture_with_tensors(const std::string& name, const std::function<void(ckpt::NamedTensors&)>& edit) {
  const std::string dir = testing::fresh_temp_dir(name);
  fs::copy_file(kFixture + "/config.json", dir + "/config.json");
  ckpt::NamedTensors t = ckpt::load_safetensors(kFixture + "/model.safetensors").tensors;
  edit(t);
  ckpt::save_safetensors(dir + "/model.safetensors", t);
  return dir;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

TEST(HfGpt2, ImportedFixtureGivesPyTorchLogits) {
  auto model = ckpt::load_hf_gpt2(kFixture);
  EXPECT_EQ(model->config().n_layer, 2);
  EXPECT_EQ(model->config().n_head, 4);
  EXPECT_EQ(model->config().n_embd, 64);
  EXPECT_EQ(model->config().vocab_size, 101);
  EXPECT_EQ(model->config().block_size, 32);
  model->eval();
  const ckpt::SafetensorsFile expected = ckpt::load_safetensors(kFixture + "/expected.safetensors");
  NoGradGuard ng;
  Tensor logits = model->forward(*expected.find("ids"));
  EXPECT_CLOSE(logits, *expected.find("logits"), 1e-5, 1e-4);
}

TEST(HfGpt2, ExportMatchesHuggingFaceLayoutOfTheFixture) {
  auto model = ckpt::load_hf_gpt2(kFixture);
  const std::string out = testing::fresh_temp_dir("hf_gpt2_export_layout");
  ckpt::export_hf_gpt2(*model, out);

  const RawSafetensors fixture = read_raw(kFixture + "/model.safetensors");
  const RawSafetensors exported = read_raw(out + "/model.safetensors");
  size_t compared = 0;
  for (auto it = fixture.header.begin(); it != fixture.header.end(); ++it) {
    const std::string& name = it.key();
    const bool mask_buffer = name.ends_with(".attn.bias");  // h.N.attn.bias, not c_attn.bias
    if (name == "__metadata__" || mask_buffer) continue;
    const std::string hf_name = "transformer." + name;  // GPT2LMHeadModel's state-dict names
    ASSERT_TRUE(exported.header.contains(hf_name)) << hf_name;
    EXPECT_EQ(exported.header[hf_name]["dtype"], "F32") << hf_name;
    EXPECT_EQ(exported.header[hf_name]["shape"], it.value()["shape"]) << hf_name;  // Conv1D stays [in, out]
    EXPECT_TRUE(exported.bytes_of(hf_name) == fixture.bytes_of(name)) << hf_name << ": bytes differ from the fixture";
    ++compared;
  }
  EXPECT_EQ(compared, 2u + 2 * 12 + 2);
  // Nothing else: no lm_head (tied), no mask buffers.
  EXPECT_EQ(exported.header.size() - exported.header.contains("__metadata__"), compared);

  const json cfg = json::parse(slurp(out + "/config.json"));
  const json want = json::parse(slurp(kFixture + "/config.json"));
  for (const char* key : {"model_type", "architectures", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
                          "n_inner", "activation_function", "layer_norm_epsilon", "bos_token_id", "eos_token_id"})
    EXPECT_EQ(cfg.at(key), want.at(key)) << key;
}

TEST(HfGpt2, ExportThenImportIsBitExact) {
  nn::GPTConfig c;
  c.n_layer = 3, c.n_head = 2, c.n_embd = 16, c.block_size = 8, c.vocab_size = 29, c.dropout = 0.25;
  nn::GPT model(c);
  const std::string out = testing::fresh_temp_dir("hf_gpt2_roundtrip");
  ckpt::export_hf_gpt2(model, out);
  const ckpt::HfGpt2 back = ckpt::import_hf_gpt2(out);
  EXPECT_EQ(back.config.n_layer, 3);
  EXPECT_EQ(back.config.n_head, 2);
  EXPECT_EQ(back.config.n_embd, 16);
  EXPECT_EQ(back.config.block_size, 8);
  EXPECT_EQ(back.config.vocab_size, 29);
  EXPECT_EQ(back.config.dropout, 0.25);
  const nn::StateDict mine = model.state_dict();
  ASSERT_EQ(back.state.size(), mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(back.state[i].first, mine[i].first);
    EXPECT_TRUE(bitwise_equal(back.state[i].second, mine[i].second)) << mine[i].first;
  }
  nn::GPT loaded(back.config);
  loaded.load_state_dict(back.state);  // strict: every name matches
}

TEST(HfGpt2, HalfPrecisionWeightsAreConvertedToF32) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::string dir = fixture_with_tensors(std::string("hf_gpt2_") + dtype_name(dt), [&](ckpt::NamedTensors& ts) {
      for (auto& [n, t] : ts) t = t.to(dt);
    });
    const ckpt::HfGpt2 half = ckpt::import_hf_gpt2(dir);
    const ckpt::HfGpt2 full = ckpt::import_hf_gpt2(kFixture);
    ASSERT_EQ(half.state.size(), full.state.size());
    for (size_t i = 0; i < full.state.size(); ++i) {
      EXPECT_EQ(half.state[i].second.dtype(), DType::f32);
      // Rounding to dt and back is what the import must have done, element for element.
      EXPECT_TRUE(bitwise_equal(half.state[i].second, full.state[i].second.to(dt).to(DType::f32))) << full.state[i].first;
    }
  }
}

TEST(HfGpt2, MissingTensorIsNamed) {
  const std::string dir = fixture_with_tensors("hf_gpt2_missing", [](ckpt::NamedTensors& ts) {
    std::erase_if(ts, [](const auto& p) { return p.first == "h.1.mlp.c_fc.bias"; });
  });
  const std::string msg = testing::error_message([&] { ckpt::import_hf_gpt2(dir); });
  EXPECT_NE(msg.find("missing tensor 'h.1.mlp.c_fc.bias'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

TEST(HfGpt2, WrongShapeIsNamed) {
  // An un-transposed (Linear-layout) c_attn weight: [3D, D] where HF stores [D, 3D].
  const std::string dir = fixture_with_tensors("hf_gpt2_shape", [](ckpt::NamedTensors& ts) {
    for (auto& [n, t] : ts)
      if (n == "h.0.attn.c_attn.weight") t = t.t().contiguous();
  });
  const std::string msg = testing::error_message([&] { ckpt::import_hf_gpt2(dir); });
  EXPECT_NE(msg.find("'h.0.attn.c_attn.weight' has shape [192, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[64, 192]"), std::string::npos) << msg;
}

TEST(HfGpt2, UnexpectedTensorAndUntiedHeadAreRejected) {
  std::string dir = fixture_with_tensors("hf_gpt2_extra", [](ckpt::NamedTensors& ts) {
    ts.emplace_back("h.2.ln_1.weight", full({64}, 1.0));
  });
  std::string msg = testing::error_message([&] { ckpt::import_hf_gpt2(dir); });
  EXPECT_NE(msg.find("unexpected tensor 'h.2.ln_1.weight'"), std::string::npos) << msg;

  dir = fixture_with_tensors("hf_gpt2_untied", [](ckpt::NamedTensors& ts) {
    ts.emplace_back("lm_head.weight", full({101, 64}, 0.5));
  });
  msg = testing::error_message([&] { ckpt::import_hf_gpt2(dir); });
  EXPECT_NE(msg.find("lm_head.weight differs from wte.weight"), std::string::npos) << msg;

  // A tied head saved as a copy of wte is accepted.
  dir = fixture_with_tensors("hf_gpt2_tied_copy", [](ckpt::NamedTensors& ts) {
    Tensor wte;
    for (auto& [n, t] : ts)
      if (n == "wte.weight") wte = t.clone();
    ts.emplace_back("lm_head.weight", wte);
  });
  EXPECT_NO_THROW(ckpt::import_hf_gpt2(dir));
}

TEST(HfGpt2, UnsupportedConfigsAreRefused) {
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"act", [](json& c) { c["activation_function"] = "relu"; }, "activation_function \"relu\" is not supported"},
      {"inv", [](json& c) { c["scale_attn_by_inverse_layer_idx"] = true; }, "scale_attn_by_inverse_layer_idx"},
      {"inner", [](json& c) { c["n_inner"] = 192; }, "n_inner 192 is not 4*n_embd = 256"},
      {"eps", [](json& c) { c["layer_norm_epsilon"] = 1e-6; }, "layer_norm_epsilon"},
      {"type", [](json& c) { c["model_type"] = "llama"; }, "model_type is \"llama\""},
      {"nokey", [](json& c) { c.erase("n_head"); }, "missing key 'n_head'"},
      {"drop", [](json& c) { c["attn_pdrop"] = 0.0; }, "differ"},
      {"vocab", [](json& c) { c["vocab_size"] = 100; }, "'wte.weight' has shape [101, 64] but config.json implies [100, 64]"},
  };
  for (const Case& c : cases) {
    const std::string dir = fixture_copy(std::string("hf_gpt2_cfg_") + c.name, c.edit);
    const std::string msg = testing::error_message([&] { ckpt::import_hf_gpt2(dir); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
  const std::string msg = testing::error_message([&] { ckpt::import_hf_gpt2(testing::fresh_temp_dir("hf_gpt2_empty")); });
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

TEST(HfGpt2, ExportRefusesModelWithoutBiases) {
  nn::GPTConfig c;
  c.n_layer = 1, c.n_head = 2, c.n_embd = 8, c.block_size = 4, c.vocab_size = 11, c.bias = false;
  nn::GPT model(c);
  const std::string msg = testing::error_message([&] { ckpt::export_hf_gpt2(model, testing::fresh_temp_dir("hf_gpt2_nobias")); });
  EXPECT_NE(msg.find("bias"), std::string::npos) << msg;
}

// The CLI: `athanor export-hf RUN_DIR OUT_DIR` on a run directory (config.yaml +
// checkpoints/) produces files the importer accepts, holding the newest checkpoint's weights.
std::string cli_binary() {
  if (const char* b = std::getenv("ATHANOR_BIN")) return b;
  const fs::path self = fs::read_symlink("/proc/self/exe");  // <build>/tests/athanor_tests_ckpt
  return (self.parent_path().parent_path() / "apps" / "athanor" / "athanor").string();
}

TEST(HfGpt2, CliExportOfARunDirectoryImports) {
  const std::string bin = cli_binary();
  ATHANOR_SKIP_IF_MISSING(!fs::exists(bin), "the athanor CLI is not built at " << bin << " (set ATHANOR_BIN)");
  const std::string run = testing::fresh_temp_dir("hf_gpt2_cli_run");
  std::ofstream(run + "/config.yaml") << "name: tiny\nmodel:\n  type: gpt\n  n_layer: 2\n  n_head: 2\n  n_embd: 16\n"
                                         "  block_size: 8\n  vocab_size: 29\n  dropout: 0.0\n";
  nn::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.block_size = 8, c.vocab_size = 29;
  nn::GPT old_model(c), new_model(c);  // different random init: the export must take the newest step
  ckpt::save_checkpoint(run + "/checkpoints", 10, {{"model.safetensors", old_model.state_dict(), {}}}, {});
  ckpt::save_checkpoint(run + "/checkpoints", 20, {{"model.safetensors", new_model.state_dict(), {}}}, {});
  const std::string out = run + "/hf";
  const std::string cmd = bin + " export-hf " + run + " " + out + " > " + run + "/log.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(run + "/log.txt");
  const ckpt::HfGpt2 back = ckpt::import_hf_gpt2(out);
  const nn::StateDict want = new_model.state_dict();
  ASSERT_EQ(back.state.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(bitwise_equal(back.state[i].second, want[i].second)) << want[i].first;

  // A run directory without a valid checkpoint: exit status 1 and a message naming it.
  const std::string empty_run = testing::fresh_temp_dir("hf_gpt2_cli_empty");
  fs::copy_file(run + "/config.yaml", empty_run + "/config.yaml");
  const std::string bad = bin + " export-hf " + empty_run + " " + empty_run + "/hf > " + empty_run + "/log.txt 2>&1";
  const int rc = std::system(bad.c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  EXPECT_NE(slurp(empty_run + "/log.txt").find("no valid checkpoint"), std::string::npos) << slurp(empty_run + "/log.txt");
}

}  // namespace
}  // namespace athanor
