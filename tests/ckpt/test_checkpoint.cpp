// Checkpoints: the checksums (XXH3-128, and OpenSSL's SHA-256 that manifests before it
// hold) against published vectors; a manifest written before XXH3-128 still verifies, and
// its damage is still caught; the manifest catches a flipped
// data byte, a truncated file, a damaged header and a missing file (naming the
// file); find_latest_valid falls back past damaged checkpoints (naming them);
// retention keeps the last K plus every M-th; a leftover temp dir is never a candidate.
#include <filesystem>
#include <fstream>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/core/error.h"
#include "ckpt/checksum.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
namespace fs = std::filesystem;

namespace {
// Per-file prefix: test files run in parallel under ctest.
std::string tmp_dir(const std::string& name) { return testing::fresh_temp_dir("ckpt_" + name); }

std::string save_step(const std::string& dir, int64_t step) {
  Tensor w = from_vector(std::vector<float>{1.f * step, 2.f, 3.f, 4.f}, {2, 2});
  return ckpt::save_checkpoint(dir, step, {{"model.safetensors", {{"w", w}}, {{"step", std::to_string(step)}}}},
                               {{"state.json", "{\"step\": " + std::to_string(step) + "}\n"}});
}

void flip_byte(const fs::path& p, std::streamoff at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(at);
  f.write(&c, 1);
}
}  // namespace

TEST(Checksum, Sha256NistVectors) {
  EXPECT_EQ(ckpt::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(ckpt::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ckpt::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(ckpt::sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// XXH3-128 as `xxhsum -H2` prints it (xxHash 0.8.1's command-line tool, Debian's xxhash).
TEST(Checksum, Xxh3Vectors) {
  auto xxh = [](const std::string& s) { return ckpt::checksum_hex(ckpt::Checksum::xxh3_128, s.data(), s.size()); };
  EXPECT_EQ(xxh(""), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(xxh("abc"), "06b05ab6733a618578af5f94892f3950");
  EXPECT_EQ(xxh(std::string(1000000, 'a')), "a545df8e384a9579b1fd6fae5285c4eb");
}

// Streaming in odd pieces equals one update, for both algorithms; and a file hashes as its bytes.
TEST(Checksum, IncrementalAndFileDigestsEqualTheOneShotDigest) {
  const std::string m(1000003, 'a');
  const std::string path = tmp_dir("checksum") + "/data.bin";
  std::ofstream(path, std::ios::binary) << m;
  for (ckpt::Checksum c : {ckpt::Checksum::xxh3_128, ckpt::Checksum::sha256}) {
    SCOPED_TRACE(ckpt::checksum_name(c));
    ckpt::Hasher h(c);
    for (size_t i = 0; i < m.size();) {
      const size_t n = std::min<size_t>(1 + i % 97, m.size() - i);
      h.update(m.data() + i, n);
      i += n;
    }
    const std::string one = ckpt::checksum_hex(c, m.data(), m.size());
    EXPECT_EQ(h.hex(), one);
    EXPECT_EQ(ckpt::checksum_file(c, path), one);
  }
  EXPECT_NE(error_message([] { ckpt::checksum_file(ckpt::Checksum::xxh3_128, "/no/such/file"); }).find("/no/such/file"),
            std::string::npos);
}

// A checkpoint written by athanor before XXH3-128 (format 1, SHA-256 digests; made by commit
// f6b3413 (main before the registry)'s `athanor train`, tests/fixtures/ckpt_format1) verifies, and its checksum still
// catches damage.
TEST(Checkpoint, AManifestWrittenBeforeXxh3StillVerifies) {
  const fs::path src = fs::path(ATHANOR_FIXTURES_DIR) / "ckpt_format1" / "step-000004";
  ASSERT_TRUE(fs::exists(src / "MANIFEST.json")) << src;
  std::ifstream mf(src / "MANIFEST.json");
  const std::string manifest((std::istreambuf_iterator<char>(mf)), std::istreambuf_iterator<char>());
  ASSERT_NE(manifest.find("\"sha256\""), std::string::npos) << "the fixture is not a SHA-256 manifest";
  const auto m = ckpt::verify_checkpoint(src.string());
  EXPECT_EQ(m.step, 4);
  ASSERT_FALSE(m.files.empty());
  for (const auto& e : m.files) EXPECT_EQ(e.algorithm, "sha256") << e.name;
  const fs::path copy = fs::path(tmp_dir("format1")) / "step-000004";
  fs::copy(src, copy, fs::copy_options::recursive);
  flip_byte(copy / "model.safetensors", static_cast<std::streamoff>(fs::file_size(copy / "model.safetensors")) - 1);
  const std::string msg = error_message([&] { ckpt::verify_checkpoint(copy.string()); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sha256 check"), std::string::npos) << msg;
}

TEST(Checkpoint, SaveWritesCompleteDirectoryAndLatest) {
  const std::string dir = tmp_dir("save");
  const std::string p = save_step(dir, 5);
  EXPECT_EQ(fs::path(p).filename().string(), "step-000005");
  for (const char* f : {"model.safetensors", "state.json", "MANIFEST.json"}) EXPECT_TRUE(fs::exists(fs::path(p) / f)) << f;
  EXPECT_EQ(ckpt::read_latest(dir), "step-000005");
  const auto m = ckpt::verify_checkpoint(p);
  EXPECT_EQ(m.step, 5);
  ASSERT_EQ(m.files.size(), 2u);
  // The digest taken while writing is the file's.
  EXPECT_EQ(m.files[0].algorithm, "xxh3_128");
  EXPECT_EQ(m.files[0].checksum, ckpt::checksum_file(ckpt::Checksum::xxh3_128, (fs::path(p) / "model.safetensors").string()));
  EXPECT_EQ(m.files[1].checksum, ckpt::checksum_file(ckpt::Checksum::xxh3_128, (fs::path(p) / "state.json").string()));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos);
}

TEST(Checkpoint, ManifestDetectsDamageAndNamesTheFile) {
  const std::string dir = tmp_dir("damage");
  auto fresh = [&] {
    fs::remove_all(dir);
    return fs::path(save_step(dir, 1));
  };
  // A flipped byte in the tensor data (the last byte of the file).
  fs::path p = fresh();
  flip_byte(p / "model.safetensors", static_cast<std::streamoff>(fs::file_size(p / "model.safetensors")) - 1);
  std::string msg = error_message([&] { ckpt::verify_checkpoint(p.string()); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("xxh3_128 check"), std::string::npos) << msg;
  // A damaged header (inside the JSON).
  p = fresh();
  flip_byte(p / "model.safetensors", 12);
  msg = error_message([&] { ckpt::verify_checkpoint(p.string()); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  // A truncated file.
  p = fresh();
  fs::resize_file(p / "state.json", 3);
  msg = error_message([&] { ckpt::verify_checkpoint(p.string()); });
  EXPECT_NE(msg.find("state.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  // A missing file.
  p = fresh();
  fs::remove(p / "state.json");
  msg = error_message([&] { ckpt::verify_checkpoint(p.string()); });
  EXPECT_NE(msg.find("state.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  // A missing manifest (a partial checkpoint).
  p = fresh();
  fs::remove(p / "MANIFEST.json");
  msg = error_message([&] { ckpt::verify_checkpoint(p.string()); });
  EXPECT_NE(msg.find("MANIFEST.json"), std::string::npos) << msg;
  // Undamaged: verifies.
  p = fresh();
  EXPECT_NO_THROW(ckpt::verify_checkpoint(p.string()));
}

TEST(Checkpoint, FindLatestValidFallsBackAndNamesTheDamagedOne) {
  const std::string dir = tmp_dir("fallback");
  save_step(dir, 2);
  save_step(dir, 4);
  const fs::path newest = save_step(dir, 6);
  flip_byte(newest / "model.safetensors", static_cast<std::streamoff>(fs::file_size(newest / "model.safetensors")) - 2);
  // A partial directory without a manifest, and a leftover temp dir of a later step.
  fs::create_directories(fs::path(dir) / "step-000008");
  std::ofstream(fs::path(dir) / "step-000008" / "model.safetensors") << "partial";
  fs::create_directories(fs::path(dir) / ".tmp.step-000010");
  const auto found = ckpt::find_latest_valid(dir);
  EXPECT_EQ(fs::path(found.path).filename().string(), "step-000004");
  EXPECT_EQ(found.step, 4);
  ASSERT_EQ(found.skipped.size(), 2u);
  EXPECT_EQ(found.skipped[0].rfind("step-000008", 0), 0u) << found.skipped[0];
  EXPECT_EQ(found.skipped[1].rfind("step-000006", 0), 0u) << found.skipped[1];
  EXPECT_NE(found.skipped[1].find("model.safetensors"), std::string::npos) << found.skipped[1];
  // Nothing valid: an empty path.
  const std::string empty = tmp_dir("fallback_empty");
  EXPECT_TRUE(ckpt::find_latest_valid(empty).path.empty());
  EXPECT_TRUE(ckpt::find_latest_valid(empty + "/nonexistent").path.empty());
}

TEST(Checkpoint, RetentionKeepsLastKAndEveryMth) {
  const std::string dir = tmp_dir("retention");
  for (int s = 1; s <= 10; ++s) {
    save_step(dir, s);
    ckpt::apply_retention(dir, 2, 4);
  }
  std::vector<int64_t> steps;
  for (const auto& [s, n] : ckpt::list_checkpoints(dir)) steps.push_back(s);
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 8, 9, 10}));
  EXPECT_EQ(ckpt::read_latest(dir), "step-000010");
  // keep_last 0 keeps everything.
  const auto deleted = ckpt::apply_retention(dir, 0, 0);
  EXPECT_TRUE(deleted.empty());
  ckpt::apply_retention(dir, 1, 0);
  EXPECT_EQ(ckpt::list_checkpoints(dir).size(), 1u);
}

TEST(Checkpoint, StepDirNames) {
  EXPECT_EQ(ckpt::step_dir_name(42), "step-000042");
  EXPECT_EQ(ckpt::parse_step_dir_name("step-000042"), 42);
  EXPECT_EQ(ckpt::parse_step_dir_name("step-"), -1);
  EXPECT_EQ(ckpt::parse_step_dir_name(".tmp.step-000042"), -1);
  EXPECT_EQ(ckpt::parse_step_dir_name("step-12a"), -1);
}

}  // namespace athanor
