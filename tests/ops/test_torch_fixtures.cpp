// Ops against PyTorch: forward outputs and gradients compared with the values
// PyTorch 1.13 computed (tests/fixtures/*.safetensors, written by
// tools/make_fixtures.py; see tests/fixtures/README.md).
//
// Each fixture case holds its inputs, `out`, an upstream gradient `gout` and
// `grad.<input>` = d<out, gout>/d<input>. A case runs the athanor op(s) on the
// inputs as leaves that require grad, calls out.backward(gout), and checks `out`
// and every stored `grad.*` (and that no differentiable input lacks one).
//
// Tolerances: f64 cases compare to |a - e| <= 1e-12 + 1e-10 |e| (both sides are
// f64 and the ops are short; anything looser would hide a wrong term that is
// merely small). The f32 run of the GPT-2 block stack against the f64 fixture
// uses 1e-4 + 1e-4 |e|, and f32 GELU against PyTorch's own f32 uses 1e-6 + 1e-5 |e|.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "fixture_reader.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

constexpr double kAtol64 = 1e-12, kRtol64 = 1e-10;
constexpr double kAtol32 = 1e-4, kRtol32 = 1e-4;

using Inputs = std::map<std::string, Tensor>;
using CaseFn = std::function<Tensor(const Inputs&)>;

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Runs one case: the entries named `prefix`<name> other than out/gout/grad.* are the
// inputs (floating ones become leaves that require grad, converted to `compute` when
// given); `fn` computes the output from them.
void check_case(const Fixture& f, const std::string& prefix, const CaseFn& fn, double atol, double rtol,
                std::optional<DType> compute = std::nullopt) {
  SCOPED_TRACE("fixture " + f.source() + " case '" + prefix + "'");
  Inputs in;
  std::vector<std::string> grads;
  for (const std::string& full : f.names()) {
    if (!starts_with(full, prefix)) continue;
    const std::string name = full.substr(prefix.size());
    if (name == "out" || name == "gout") continue;
    if (starts_with(name, "grad.")) {
      grads.push_back(name.substr(5));
      continue;
    }
    const bool floating = is_floating(f.entry(full).dtype);
    in[name] = f.get(full, floating ? compute : std::nullopt, /*requires_grad=*/floating);
  }
  ASSERT_FALSE(in.empty()) << "no inputs under prefix '" << prefix << "'";
  for (const auto& [name, t] : in) {
    if (t.requires_grad()) {
      EXPECT_NE(std::find(grads.begin(), grads.end(), name), grads.end()) << "fixture has no grad." << name;
    }
  }

  Tensor out = fn(in);
  EXPECT_CLOSE(out, f.get(prefix + "out"), atol, rtol) << "forward";
  Tensor gout = f.get(prefix + "gout", compute);
  out.backward(gout);
  for (const std::string& name : grads) {
    SCOPED_TRACE("grad." + name);
    ASSERT_TRUE(in.count(name)) << "grad." << name << " names no input";
    Tensor g = in.at(name).grad();
    ASSERT_TRUE(g.defined()) << "athanor produced no gradient for " << name;
    EXPECT_CLOSE(g, f.get(prefix + "grad." + name), atol, rtol);
  }
}

Fixture load(const std::string& file) { return Fixture::load(fixture_path(file)); }

}  // namespace

TEST(TorchFixtures, Matmul) {
  const Fixture f = load("matmul.safetensors");
  const CaseFn fn = [](const Inputs& x) { return matmul(x.at("a"), x.at("b")); };
  for (const char* c : {"batched_2d.", "broadcast_both.", "vec_left."}) check_case(f, c, fn, kAtol64, kRtol64);
}

TEST(TorchFixtures, Linear) {
  const Fixture f = load("linear.safetensors");
  check_case(f, "bias.", [](const Inputs& x) { return linear(x.at("x"), x.at("weight"), x.at("bias")); }, kAtol64, kRtol64);
  check_case(f, "nobias.", [](const Inputs& x) { return linear(x.at("x"), x.at("weight")); }, kAtol64, kRtol64);
}

TEST(TorchFixtures, LayerNorm) {
  const Fixture f = load("layer_norm.safetensors");
  check_case(f, "", [](const Inputs& x) { return layer_norm(x.at("x"), {8}, x.at("weight"), x.at("bias"), 1e-5); },
             kAtol64, kRtol64);
}

TEST(TorchFixtures, Gelu) {
  const Fixture f = load("gelu.safetensors");
  check_case(f, "exact.", [](const Inputs& x) { return gelu(x.at("x"), GeluApprox::none); }, kAtol64, kRtol64);
  check_case(f, "tanh.", [](const Inputs& x) { return gelu(x.at("x"), GeluApprox::tanh); }, kAtol64, kRtol64);
}

TEST(TorchFixtures, GeluF32MatchesTorchF32) {
  const Fixture f = load("gelu.safetensors");
  ASSERT_EQ(f.entry("f32.exact.x").dtype, DType::f32);
  check_case(f, "f32.exact.", [](const Inputs& x) { return gelu(x.at("x"), GeluApprox::none); }, 1e-6, 1e-5);
  check_case(f, "f32.tanh.", [](const Inputs& x) { return gelu(x.at("x"), GeluApprox::tanh); }, 1e-6, 1e-5);
}

TEST(TorchFixtures, SoftmaxAndLogSoftmax) {
  // Rows offset by +-1000 check that the max is subtracted.
  const Fixture f = load("softmax.safetensors");
  check_case(f, "softmax.", [](const Inputs& x) { return softmax(x.at("x"), -1); }, kAtol64, kRtol64);
  check_case(f, "log_softmax.", [](const Inputs& x) { return log_softmax(x.at("x"), -1); }, kAtol64, kRtol64);
}

TEST(TorchFixtures, CrossEntropy) {
  // plain: mean over all rows; the others have targets 1 and 4 = -100 (ignored) and
  // label_smoothing 0.1, reduced by mean (over the 4 counted rows), sum, and none.
  const Fixture f = load("cross_entropy.safetensors");
  check_case(f, "plain.", [](const Inputs& x) { return cross_entropy(x.at("logits"), x.at("target")); }, kAtol64, kRtol64);
  const std::pair<const char*, Reduction> cases[] = {
      {"ignore_smooth.", Reduction::mean}, {"ignore_smooth_sum.", Reduction::sum}, {"ignore_smooth_none.", Reduction::none}};
  for (const auto& [prefix, red] : cases)
    check_case(f, prefix, [red = red](const Inputs& x) { return cross_entropy(x.at("logits"), x.at("target"), -100, 0.1, red); },
               kAtol64, kRtol64);
}

TEST(TorchFixtures, ScaledDotProductAttention) {
  // q, k, v: [2, 2, Tq|Tk, 4]; "_rect" cases have Tq=3, Tk=6 (causal mask top-left aligned).
  const Fixture f = load("attention.safetensors");
  auto sdpa = [](bool causal, std::optional<double> scale = std::nullopt) -> CaseFn {
    return [=](const Inputs& x) { return scaled_dot_product_attention(x.at("q"), x.at("k"), x.at("v"), causal, scale); };
  };
  check_case(f, "noncausal.", sdpa(false), kAtol64, kRtol64);
  check_case(f, "causal.", sdpa(true), kAtol64, kRtol64);
  check_case(f, "noncausal_rect.", sdpa(false), kAtol64, kRtol64);
  check_case(f, "causal_rect.", sdpa(true), kAtol64, kRtol64);
  check_case(f, "scale0.3.", sdpa(false, 0.3), kAtol64, kRtol64);
}

namespace {
// Two GPT-2 blocks (pre-norm): x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
// Linear weights are [out, in]; B=2, T=8, d=16, H=2 as in tools/make_fixtures.py.
Tensor gpt2_blocks(const Inputs& w) {
  constexpr int64_t kLayers = 2, kHeads = 2;
  Tensor x = w.at("x");
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2);
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, kHeads, d / kHeads}), 1, 2); };
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    auto W = [&](const std::string& n) { return w.at(p + n); };
    Tensor h = layer_norm(x, {d}, W("ln_1.weight"), W("ln_1.bias"), 1e-5);
    std::vector<Tensor> qkv = split(linear(h, W("attn.c_attn.weight"), W("attn.c_attn.bias")), d, -1);
    EXPECT_EQ(qkv.size(), 3u);
    Tensor a = scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), /*is_causal=*/true);
    a = reshape(transpose(a, 1, 2), {B, T, d});
    x = x + linear(a, W("attn.c_proj.weight"), W("attn.c_proj.bias"));
    h = layer_norm(x, {d}, W("ln_2.weight"), W("ln_2.bias"), 1e-5);
    Tensor m = gelu(linear(h, W("mlp.c_fc.weight"), W("mlp.c_fc.bias")), GeluApprox::tanh);
    x = x + linear(m, W("mlp.c_proj.weight"), W("mlp.c_proj.bias"));
  }
  return x;
}
}  // namespace

TEST(TorchFixtures, Gpt2BlockStack) {
  const Fixture f = load("gpt2_blocks.safetensors");
  ASSERT_EQ(f.names().size(), 52u);  // x, out, gout, grad.x, 24 weights and their 24 grads
  check_case(f, "", gpt2_blocks, kAtol64, kRtol64);
}

TEST(TorchFixtures, Gpt2BlockStackF32) {
  // The same stack computed in f32 (weights, x and gout converted) against the f64 fixture.
  const Fixture f = load("gpt2_blocks.safetensors");
  check_case(f, "", gpt2_blocks, kAtol32, kRtol32, DType::f32);
}

// ---- the reader itself: corrupt fixtures fail with a message, never crash.

namespace {
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
std::string parse_error(const std::string& bytes) {
  try {
    Fixture::parse(bytes, "test.safetensors");
  } catch (const FixtureError& e) {
    return e.what();
  }
  ADD_FAILURE() << "corrupt fixture was accepted";
  return "";
}
std::string with_header(const std::string& json, const std::string& data) {
  std::string h = json;
  while (h.size() % 8) h += ' ';
  std::string out(8, '\0');
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}
}  // namespace

TEST(TorchFixtures, ReaderLoadsValuesDtypesAndMetadata) {
  const Fixture f = load("cross_entropy.safetensors");
  EXPECT_EQ(f.metadata().at("generator"), "tools/make_fixtures.py");
  Tensor t = f.get("ignore_smooth.target");
  EXPECT_EQ(t.dtype(), DType::i64);
  EXPECT_EQ(t.to_vector()[1], -100);
  EXPECT_EQ(t.to_vector()[4], -100);
  EXPECT_EQ(f.get("plain.out").dim(), 0);
  // Hand-built file: F64 [2] = {1.5, -2}, F32 [] = 3.25.
  double d[2] = {1.5, -2.0};
  float s = 3.25f;
  std::string data(reinterpret_cast<char*>(d), 16);
  data += std::string(reinterpret_cast<char*>(&s), 4);
  const Fixture g = Fixture::parse(
      with_header(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[],"data_offsets":[16,20]}})", data),
      "hand");
  EXPECT_CLOSE(g.get("a"), from_vector(std::vector<double>{1.5, -2.0}, {2}, DType::f64), 0, 0);
  EXPECT_EQ(g.get("b").dtype(), DType::f32);
  EXPECT_EQ(g.get("b").item(), 3.25);
  EXPECT_EQ(g.get("b", DType::f64).dtype(), DType::f64);
  EXPECT_TRUE(g.get("a", std::nullopt, true).requires_grad());
}

TEST(TorchFixtures, ReaderRejectsCorruptFiles) {
  const std::string good = file_bytes(fixture_path("layer_norm.safetensors"));
  ASSERT_GT(good.size(), 200u);
  EXPECT_NE(parse_error(good.substr(0, 5)).find("shorter than the 8-byte header"), std::string::npos);
  EXPECT_NE(parse_error(good.substr(0, good.size() - 40)).find("outside the data block"), std::string::npos)
      << "a truncated file is caught by the offsets";
  EXPECT_NE(parse_error(good.substr(0, 60)).find("runs past the end"), std::string::npos);
  std::string bad_json = good;
  bad_json[8] = '[';
  bad_json[9] = '}';
  EXPECT_NE(parse_error(bad_json).find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error(good + "xxxxxxxx").find("trailing bytes"), std::string::npos);
  const std::string d8(8, '\0');
  EXPECT_NE(parse_error(with_header(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", d8)).find("needs 16"),
            std::string::npos);
  EXPECT_NE(parse_error(with_header(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,16]}})", d8)).find("outside the data block"),
            std::string::npos);
  EXPECT_NE(parse_error(with_header(R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}})", d8)).find("unsupported dtype"),
            std::string::npos);
  EXPECT_NE(parse_error(with_header(R"({"a":{"dtype":"F64","shape":[-1],"data_offsets":[0,8]}})", d8)).find("negative"),
            std::string::npos);
  EXPECT_NE(parse_error(with_header(R"({"a":{"dtype":"F64","shape":[1]}})", d8)).find("needs dtype, shape and data_offsets"),
            std::string::npos);
  EXPECT_NE(parse_error(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8))
                .find("overlap"),
            std::string::npos);
  // A missing name lists what the file has.
  try {
    load("layer_norm.safetensors").get("nope");
    ADD_FAILURE() << "missing name accepted";
  } catch (const FixtureError& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor named 'nope'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Fixture::load(fixture_path("does_not_exist.safetensors")), FixtureError);
}

}  // namespace athanor
