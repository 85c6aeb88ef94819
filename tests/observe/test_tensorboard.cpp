// TensorBoard event files: CRC-32C against published vectors, TFRecord framing,
// a round trip through a reader written here (independent of the writer's
// encoder), and the Python/protobuf decoder in tb_decode.py, which must also
// reject a file with a flipped byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <sys/wait.h>

#include "athanor/observe/tensorboard.h"
#include "observe/crc32c.h"
#include "test_util.h"

namespace athanor::observe {
namespace {
namespace fs = std::filesystem;

// ---- a minimal reader, sharing no code with the writer ----
struct Field {
  int number = 0;
  int wire_type = 0;
  uint64_t integer = 0;  // varint, fixed32, fixed64 (raw bits)
  std::string bytes;     // length-delimited
};

uint64_t read_varint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= s.size()) throw std::runtime_error("varint past end");
    const auto b = static_cast<unsigned char>(s[pos++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
  throw std::runtime_error("varint too long");
}

uint64_t read_le(const std::string& s, size_t pos, int nbytes) {
  if (pos + nbytes > s.size()) throw std::runtime_error("fixed field past end");
  uint64_t v = 0;
  for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[pos + i]);
  return v;
}

std::vector<Field> parse_message(const std::string& s) {
  std::vector<Field> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const uint64_t key = read_varint(s, pos);
    Field f;
    f.number = static_cast<int>(key >> 3);
    f.wire_type = static_cast<int>(key & 7);
    if (f.wire_type == 0) {
      f.integer = read_varint(s, pos);
    } else if (f.wire_type == 1) {
      f.integer = read_le(s, pos, 8);
      pos += 8;
    } else if (f.wire_type == 5) {
      f.integer = read_le(s, pos, 4);
      pos += 4;
    } else if (f.wire_type == 2) {
      const uint64_t n = read_varint(s, pos);
      if (pos + n > s.size()) throw std::runtime_error("bytes past end");
      f.bytes = s.substr(pos, n);
      pos += n;
    } else {
      throw std::runtime_error("unexpected wire type " + std::to_string(f.wire_type));
    }
    out.push_back(f);
  }
  return out;
}

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;
};

DecodedEvent decode_event(const std::string& data) {
  DecodedEvent e;
  for (const Field& f : parse_message(data)) {
    if (f.number == 1 && f.wire_type == 1) std::memcpy(&e.wall_time, &f.integer, 8);
    else if (f.number == 2 && f.wire_type == 0) e.step = static_cast<int64_t>(f.integer);
    else if (f.number == 3 && f.wire_type == 2) e.file_version = f.bytes;
    else if (f.number == 5 && f.wire_type == 2) {
      for (const Field& v : parse_message(f.bytes)) {
        if (v.number != 1 || v.wire_type != 2) throw std::runtime_error("Summary: unexpected field");
        std::string tag;
        float value = 0;
        for (const Field& vf : parse_message(v.bytes)) {
          if (vf.number == 1 && vf.wire_type == 2) tag = vf.bytes;
          else if (vf.number == 2 && vf.wire_type == 5) {
            const auto bits = static_cast<uint32_t>(vf.integer);
            std::memcpy(&value, &bits, 4);
          } else throw std::runtime_error("Value: unexpected field");
        }
        e.values.emplace_back(tag, value);
      }
    } else {
      throw std::runtime_error("Event: unexpected field " + std::to_string(f.number));
    }
  }
  return e;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Splits a TFRecord file, checking both CRCs of every record.
std::vector<std::string> read_records(const std::string& blob) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < blob.size()) {
    const uint64_t n = read_le(blob, pos, 8);
    EXPECT_EQ(read_le(blob, pos + 8, 4), masked_crc32c(blob.data() + pos, 8)) << "length CRC at byte " << pos;
    const std::string data = blob.substr(pos + 12, n);
    EXPECT_EQ(read_le(blob, pos + 12 + n, 4), masked_crc32c(data.data(), data.size())) << "data CRC at byte " << pos;
    out.push_back(data);
    pos += 12 + n + 4;
  }
  EXPECT_EQ(pos, blob.size());
  return out;
}

std::string only_event_file(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  EXPECT_EQ(files.size(), 1u);
  EXPECT_EQ(fs::path(files.at(0)).filename().string().rfind("events.out.tfevents.", 0), 0u);
  return files.at(0);
}

TEST(Crc32c, KnownVectors) {
  // "123456789" is the standard check value; the 32-byte ones are from RFC 3720 (iSCSI), appendix B.4.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<unsigned char>(i);
    descending[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32c, MaskIsRotateAndAdd) {
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
}

TEST(TensorBoard, FramingLengths) {
  for (size_t n : {0u, 1u, 127u, 128u, 1000u}) {
    const std::string data(n, 'x');
    const std::string rec = frame_tfrecord(data);
    ASSERT_EQ(rec.size(), 8 + 4 + n + 4);
    EXPECT_EQ(read_le(rec, 0, 8), n);
    EXPECT_EQ(rec.substr(12, n), data);
    EXPECT_EQ(read_records(rec).size(), 1u);
  }
}

TEST(TensorBoard, WriterRoundTrip) {
  const std::string dir = testing::fresh_temp_dir("tb_round_trip");
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    w.add_scalar("train/loss", 2.5, 1, 1000.25);
    w.add_scalar("train/lr", 3e-4, 1, 1000.25);
    w.add_scalar("eval/loss", std::nan(""), 1u << 20, 1001.5);
    w.add_scalar("weird tag/é", -1e30, 3000000000LL, 1002.0);
  }
  EXPECT_EQ(only_event_file(dir), path);
  const auto records = read_records(read_file(path));
  ASSERT_EQ(records.size(), 5u);
  const DecodedEvent first = decode_event(records[0]);
  EXPECT_EQ(first.file_version, "brain.Event:2");
  EXPECT_EQ(first.step, 0);
  EXPECT_GT(first.wall_time, 1.6e9);  // a real unix time
  struct Want { std::string tag; double value; int64_t step; double wall; };
  const std::vector<Want> want = {{"train/loss", 2.5, 1, 1000.25}, {"train/lr", 3e-4, 1, 1000.25},
                                  {"eval/loss", std::nan(""), 1 << 20, 1001.5}, {"weird tag/é", -1e30, 3000000000LL, 1002.0}};
  for (size_t i = 0; i < want.size(); ++i) {
    const DecodedEvent e = decode_event(records[i + 1]);
    ASSERT_EQ(e.values.size(), 1u);
    EXPECT_EQ(e.values[0].first, want[i].tag);
    if (std::isnan(want[i].value)) EXPECT_TRUE(std::isnan(e.values[0].second));
    else EXPECT_EQ(e.values[0].second, static_cast<float>(want[i].value));
    EXPECT_EQ(e.step, want[i].step);
    EXPECT_EQ(e.wall_time, want[i].wall);
  }
}

TEST(TensorBoard, SinkMapsMetricsToTags) {
  const std::string dir = testing::fresh_temp_dir("tb_sink");
  std::string path;
  {
    TensorBoardSink sink(dir);
    path = sink.path();
    StepMetrics m;
    m.step = 7;
    m.loss = std::nan("");  // written anyway
    m.lr = 0.01;
    m.grad_norm = INFINITY;  // skipped
    m.grad_norm_clipped = 1.0;
    m.skipped_total = 2;
    m.throughput = 1234.5;
    m.step_seconds = 0.5;
    m.data_seconds = 0.01;
    m.forward_seconds = 0.2;
    m.backward_seconds = 0.25;
    m.optimizer_seconds = 0.04;
    m.memory = {{"parameter", 3 * 1024 * 1024, 4 * 1024 * 1024}};
    sink.on_step(m);  // loss_scale 0 and mfu -1: no tags
    m.step = 8;
    m.loss = 1.5;
    m.loss_scale = 65536;
    m.mfu = 0.4;
    m.grad_norm = 3.0;
    m.memory.clear();
    sink.on_step(m);
    sink.on_eval({8, 1.25, 0.75, 100});
    sink.on_eval({9, 1.5, -1, 100});  // no accuracy for language models
  }
  std::map<std::pair<int64_t, std::string>, float> got;
  const auto records = read_records(read_file(path));
  for (size_t i = 1; i < records.size(); ++i) {
    const DecodedEvent e = decode_event(records[i]);
    for (const auto& [tag, v] : e.values) EXPECT_TRUE(got.emplace(std::make_pair(e.step, tag), v).second) << tag;
  }
  const std::set<std::string> step7 = {"train/loss", "train/lr", "train/grad_norm_clipped", "train/skipped_total",
                                       "perf/throughput", "time/step_ms", "time/data_ms", "time/forward_ms",
                                       "time/backward_ms", "time/optimizer_ms", "time/comm_ms",
                                       "mem/parameter_peak_mib", "mem/parameter_mib"};
  std::set<std::string> tags7;
  for (const auto& [k, v] : got)
    if (k.first == 7) tags7.insert(k.second);
  EXPECT_EQ(tags7, step7);
  EXPECT_TRUE(std::isnan(got.at({7, "train/loss"})));
  EXPECT_FLOAT_EQ(got.at({7, "time/forward_ms"}), 200.0f);
  EXPECT_FLOAT_EQ(got.at({7, "mem/parameter_mib"}), 3.0f);
  EXPECT_FLOAT_EQ(got.at({7, "mem/parameter_peak_mib"}), 4.0f);
  EXPECT_FLOAT_EQ(got.at({7, "train/skipped_total"}), 2.0f);
  EXPECT_FLOAT_EQ(got.at({8, "train/loss_scale"}), 65536.0f);
  EXPECT_FLOAT_EQ(got.at({8, "perf/mfu"}), 0.4f);
  EXPECT_FLOAT_EQ(got.at({8, "train/grad_norm"}), 3.0f);
  EXPECT_FLOAT_EQ(got.at({8, "eval/loss"}), 1.25f);
  EXPECT_FLOAT_EQ(got.at({8, "eval/accuracy"}), 0.75f);
  EXPECT_EQ(got.count({9, "eval/accuracy"}), 0u);
  EXPECT_EQ(got.count({9, "eval/loss"}), 1u);
}

// A step's scalars are written together and flushed before on_step returns: a run
// killed after a step keeps all of it (the file is read while the sink is still open).
TEST(TensorBoard, SinkFlushesEachStepWhole) {
  const std::string dir = testing::fresh_temp_dir("tb_flush");
  TensorBoardSink sink(dir);
  StepMetrics m;
  m.step = 3;
  m.loss = 2.0;
  m.lr = 0.1;
  sink.on_step(m);
  auto records = read_records(read_file(sink.path()));
  ASSERT_GE(records.size(), 3u);  // file_version, train/loss, train/lr, ...
  std::set<std::string> tags;
  for (size_t i = 1; i < records.size(); ++i) {
    const DecodedEvent e = decode_event(records[i]);
    EXPECT_EQ(e.step, 3);
    for (const auto& [tag, v] : e.values) tags.insert(tag);
  }
  EXPECT_TRUE(tags.count("train/loss") && tags.count("train/lr") && tags.count("time/step_ms"));
  const size_t after_one = records.size();
  m.step = 4;
  sink.on_step(m);
  records = read_records(read_file(sink.path()));
  EXPECT_EQ(records.size(), 2 * after_one - 1);
}

TEST(TensorBoard, UnwritableDirectoryIsAnError) {
  const std::string dir = testing::fresh_temp_dir("tb_unwritable");
  std::ofstream(dir + "/file") << "x";
  const std::string msg = testing::error_message([&] { TensorBoardWriter w(dir + "/file/tb"); });
  EXPECT_NE(msg.find(dir + "/file/tb"), std::string::npos) << msg;
}

// tb_decode.py: an independent decoder (Python protobuf + its own CRC-32C).
std::string python() { return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3"; }

int run_decoder(const std::string& events, const std::string& expected) {
  const std::string cmd = python() + " " ATHANOR_SOURCE_DIR "/tests/observe/tb_decode.py '" + events + "' '" + expected + "'";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(TensorBoard, PythonProtobufDecoderAgreesAndRejectsCorruption) {
  const std::string dir = testing::fresh_temp_dir("tb_python");
  const int probe = std::system((python() + " -c 'import google.protobuf' 2>/dev/null").c_str());
  ASSERT_EQ(probe, 0) << "python3 with google.protobuf is needed: apt-get install python3-protobuf (scripts/setup.sh)";
  std::string path;
  std::ostringstream expected;
  expected.precision(17);
  expected << "{\"file_version\": \"brain.Event:2\", \"scalars\": [";
  {
    TensorBoardWriter w(dir + "/tb");
    path = w.path();
    for (int i = 0; i < 40; ++i) {
      const double value = i == 13 ? std::nan("") : std::exp(-0.1 * i) * (i % 3 == 0 ? -1 : 1) * 123.456;
      const std::string tag = i % 2 ? "train/loss" : "perf/throughput";
      const int64_t step = static_cast<int64_t>(i) * 1000003;
      const double wall = 1.7e9 + 0.125 * i;
      w.add_scalar(tag, value, step, wall);
      expected << (i ? ", " : "") << "{\"tag\": \"" << tag << "\", \"step\": " << step << ", \"value\": ";
      if (std::isnan(value)) expected << "null";
      else expected << value;
      expected << ", \"wall_time\": " << wall << "}";
    }
  }
  expected << "]}";
  const std::string expected_path = dir + "/expected.json";
  std::ofstream(expected_path) << expected.str();
  EXPECT_EQ(run_decoder(path, expected_path), 0);

  // The decoder must notice a wrong expectation...
  std::string wrong = expected.str();
  wrong.replace(wrong.find("perf/throughput"), 4, "PERF");
  std::ofstream(dir + "/wrong.json") << wrong;
  EXPECT_EQ(run_decoder(path, dir + "/wrong.json"), 1);
  // ... and a flipped byte in the payload of one record or in a length.
  const std::string blob = read_file(path);
  for (size_t at : {blob.size() / 2, size_t{2}}) {
    std::string bad = blob;
    bad[at] = static_cast<char>(bad[at] ^ 0x20);
    const std::string bad_path = dir + "/corrupt.tfevents";
    std::ofstream(bad_path, std::ios::binary) << bad;
    EXPECT_EQ(run_decoder(bad_path, expected_path), 1) << "flipped byte " << at;
  }
}

}  // namespace
}  // namespace athanor::observe
