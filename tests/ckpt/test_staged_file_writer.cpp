// StagedFileWriter: every byte lands where it was written, whatever the sizes of the writes
// against the staging buffer and O_DIRECT's block, on a disk filesystem (O_DIRECT) and on
// tmpfs (where it is refused or not, the bytes are the same); errors name the file.
#include "ckpt/staged_file_writer.h"

#include <sys/vfs.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "test_util.h"

namespace athanor {
namespace fs = std::filesystem;

namespace {
std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Writes `total` pseudo-random bytes in pieces of `piece` bytes (the last one shorter) and
// checks the file against the bytes.
void round_trip(const std::string& dir, std::size_t total, std::size_t piece) {
  std::string bytes(total, '\0');
  std::mt19937 rng(static_cast<unsigned>(total * 31 + piece));
  for (char& c : bytes) c = static_cast<char>(rng());
  const std::string path = (fs::path(dir) / ("athanor_staged_" + std::to_string(total) + "_" + std::to_string(piece))).string();
  uint64_t size = 0;
  {
    ckpt::StagedFileWriter w(path, "test");
    for (std::size_t at = 0; at < total; at += piece) w.write(bytes.data() + at, std::min(piece, total - at));
    size = w.finish();
  }
  EXPECT_EQ(size, total) << path;
  EXPECT_EQ(fs::file_size(path), total) << path;
  EXPECT_TRUE(read_file(path) == bytes) << path << ": the file differs from what was written";
  fs::remove(path);
}
}  // namespace

TEST(StagedFileWriter, WritesEveryByteAcrossBufferAndBlockBoundaries) {
  constexpr std::size_t B = ckpt::StagedFileWriter::kBuffer, A = ckpt::StagedFileWriter::kAlign;
  std::vector<std::string> dirs = {fs::temp_directory_path().string()};
  if (fs::is_directory("/dev/shm")) dirs.push_back("/dev/shm");  // tmpfs: O_DIRECT refused on older kernels
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    round_trip(dir, 0, 1);
    round_trip(dir, 1, 1);
    round_trip(dir, A - 1, 7);
    round_trip(dir, A + 1, A);
    round_trip(dir, B, B);          // exactly one buffer: nothing left for the tail
    round_trip(dir, B + 1, 4093);   // one byte past it, in pieces that straddle blocks
    round_trip(dir, 2 * B + 3 * A + 5, (1 << 20) + 3);  // both buffers reused, a ragged tail
  }
}

TEST(StagedFileWriter, GoesAroundThePageCacheOnExt4AndXfs) {
  // The point of the writer: on the disk filesystems that support O_DIRECT, the data goes
  // around the page cache. (Elsewhere the files are still right, by the test above.)
  const fs::path dir = fs::temp_directory_path();
  struct statfs st {};
  ASSERT_EQ(::statfs(dir.c_str(), &st), 0);
  constexpr long kExt4 = 0xEF53, kXfs = 0x58465342;
  if (st.f_type != kExt4 && st.f_type != kXfs) GTEST_SKIP() << dir << " is neither ext4 nor xfs";
  const std::string path = (dir / "athanor_staged_direct").string();
  ckpt::StagedFileWriter w(path, "test");
  EXPECT_TRUE(w.direct()) << path << ": O_DIRECT was not used on ext4/xfs";
  w.finish();
  fs::remove(path);
}

TEST(StagedFileWriter, ErrorsNameTheFile) {
  try {
    ckpt::StagedFileWriter w("/nonexistent-dir/athanor/x.safetensors", "save_safetensors");
    FAIL() << "no error for a file in a missing directory";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/nonexistent-dir/athanor/x.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("cannot create"), std::string::npos) << m;
  }
}

}  // namespace athanor
