// Sharded checkpoints on one process (the multi-rank save is tested under mpirun in
// tests/dist/test_zero.cpp): the split commit (begin / write / commit) makes the same
// checkpoint as save_checkpoint; verify with a hashing filter still checks sizes;
// load_checkpoint_tensors merges shards through their index and refuses an index and
// shards that disagree, naming the file and the tensor.
#include <filesystem>
#include <fstream>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/sharded_checkpoint.h"
#include "athanor/core/error.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
namespace fs = std::filesystem;

namespace {
std::string tmp_dir(const std::string& name) { return testing::fresh_temp_dir("ckpt_sharded_" + name); }

Tensor values(float start, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + 0.5f * static_cast<float>(i);
  return from_vector(v, {n});
}

// A checkpoint in the layout save_sharded_checkpoint writes for 2 ranks, made with the
// one-process primitives: "a" and "b" in shard 1, "c" in shard 2.
std::string write_two_shards(const std::string& dir, const std::string& index_json) {
  const std::string tmp = ckpt::begin_checkpoint(dir, 7);
  std::vector<ckpt::ManifestEntry> entries;
  entries.push_back(ckpt::write_tensor_file(tmp, {ckpt::shard_file_name("model", 0, 2), {{"a", values(1, 3)}, {"b", values(2, 5)}}, {}}));
  entries.push_back(ckpt::write_tensor_file(tmp, {ckpt::shard_file_name("model", 1, 2), {{"c", values(3, 4)}}, {}}));
  entries.push_back(ckpt::write_text_file(tmp, {ckpt::shard_index_name("model"), index_json}));
  return ckpt::commit_checkpoint(dir, 7, entries);
}

const char* kGoodIndex = R"({"metadata": {"total_size": 48},
  "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors"}})";
}  // namespace

TEST(ShardedCheckpoint, FileNamesFollowHuggingFace) {
  EXPECT_EQ(ckpt::shard_file_name("model", 0, 4), "model-00001-of-00004.safetensors");
  EXPECT_EQ(ckpt::shard_file_name("optimizer", 3, 4), "optimizer-00004-of-00004.safetensors");
  EXPECT_EQ(ckpt::shard_index_name("model"), "model.safetensors.index.json");
}

TEST(ShardedCheckpoint, SplitCommitWritesAVerifiedCheckpointAndMergesTheShards) {
  const std::string dir = tmp_dir("merge");
  const std::string p = write_two_shards(dir, kGoodIndex);
  EXPECT_EQ(ckpt::read_latest(dir), "step-000007");
  EXPECT_FALSE(fs::exists(ckpt::tmp_checkpoint_dir(dir, 7)));
  const ckpt::Manifest m = ckpt::verify_checkpoint(p);
  EXPECT_EQ(m.files.size(), 3u);
  ASSERT_TRUE(ckpt::has_checkpoint_tensors(p, "model"));
  EXPECT_FALSE(ckpt::has_checkpoint_tensors(p, "optimizer"));
  const ckpt::SafetensorsFile all = ckpt::load_checkpoint_tensors(p, "model");
  ASSERT_EQ(all.tensors.size(), 3u);
  std::map<std::string, Tensor> by(all.tensors.begin(), all.tensors.end());
  EXPECT_EQ(by["a"].to_vector(), values(1, 3).to_vector());
  EXPECT_EQ(by["b"].to_vector(), values(2, 5).to_vector());
  EXPECT_EQ(by["c"].to_vector(), values(3, 4).to_vector());
  // A single file wins when present (a 1-process checkpoint).
  const std::string one = ckpt::save_checkpoint(tmp_dir("single"), 1, {{"model.safetensors", {{"w", values(9, 2)}}, {}}}, {});
  EXPECT_EQ(ckpt::load_checkpoint_tensors(one, "model").tensors.at(0).second.to_vector(), values(9, 2).to_vector());
}

TEST(ShardedCheckpoint, VerifyWithAFilterHashesOnlyTheSelectedFilesButChecksEverySize) {
  const std::string dir = tmp_dir("filter");
  const fs::path p = write_two_shards(dir, kGoodIndex);
  const ckpt::Manifest m = ckpt::read_manifest(p.string());
  std::size_t shard2 = m.files.size();
  for (std::size_t i = 0; i < m.files.size(); ++i)
    if (m.files[i].name == "model-00002-of-00002.safetensors") shard2 = i;
  ASSERT_LT(shard2, m.files.size());
  {  // flip the last data byte of shard 2 (same size)
    const fs::path f = p / "model-00002-of-00002.safetensors";
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(-1, std::ios::end);
    char c;
    s.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    s.seekp(-1, std::ios::end);
    s.write(&c, 1);
  }
  EXPECT_NO_THROW(ckpt::verify_checkpoint(p.string(), [&](std::size_t i) { return i != shard2; }));
  const std::string msg = error_message([&] { ckpt::verify_checkpoint(p.string(), [&](std::size_t i) { return i == shard2; }); });
  EXPECT_NE(msg.find("model-00002-of-00002.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("xxh3_128 check"), std::string::npos) << msg;
  // A truncated file fails on size even where it is not hashed.
  fs::resize_file(p / "model-00002-of-00002.safetensors", fs::file_size(p / "model-00002-of-00002.safetensors") - 4);
  const std::string msg2 = error_message([&] { ckpt::verify_checkpoint(p.string(), [&](std::size_t) { return false; }); });
  EXPECT_NE(msg2.find("bytes but the manifest says"), std::string::npos) << msg2;
}

TEST(ShardedCheckpoint, AnIndexThatDisagreesWithTheShardsIsAnErrorNamingTheTensor) {
  struct Case {
    const char* what;
    std::string index;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"tensor in the wrong shard",
       R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})",
       "'b' is in shard 'model-00001-of-00002.safetensors' but model.safetensors.index.json places it in 'model-00002-of-00002.safetensors'"},
      {"tensor the index does not list",
       R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})",
       "holds 'b', which model.safetensors.index.json does not list"},
      {"listed tensor no shard holds",
       R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"}})",
       "places 'd' in 'model-00002-of-00002.safetensors', which does not hold it"},
      {"missing shard file",
       R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors", "e": "model-00003-of-00003.safetensors"}})",
       "lists shard 'model-00003-of-00003.safetensors', which is missing"},
      {"not JSON", "{\"weight_map\": ", "is not valid JSON"},
      {"no weight_map", "{\"metadata\": {}}", "has no \"weight_map\" object"},
      {"path in a file name", R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})", "names a bad shard file"},
  };
  for (const Case& c : cases) {
    const std::string p = write_two_shards(tmp_dir("bad"), c.index);
    const std::string msg = error_message([&] { ckpt::load_checkpoint_tensors(p, "model"); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
  }
  const std::string msg = error_message([&] { ckpt::load_checkpoint_tensors(tmp_dir("empty"), "model"); });
  EXPECT_NE(msg.find("holds neither model.safetensors nor the index of its shards"), std::string::npos) << msg;
}

TEST(ShardedCheckpoint, TwoFilesOfTheSameNameAreRefusedAtCommit) {
  const std::string dir = tmp_dir("dup");
  const std::string tmp = ckpt::begin_checkpoint(dir, 3);
  const ckpt::ManifestEntry e = ckpt::write_text_file(tmp, {"state.json", "{}"});
  const std::string msg = error_message([&] { ckpt::commit_checkpoint(dir, 3, {e, e}); });
  EXPECT_NE(msg.find("two files named 'state.json'"), std::string::npos) << msg;
  EXPECT_EQ(ckpt::read_latest(dir), "");  // nothing committed
}

}  // namespace athanor
