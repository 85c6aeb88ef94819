#pragma once
// A small, strict safetensors reader for tests: loads the PyTorch fixtures that
// tools/make_fixtures.py writes into tests/fixtures/ and hands back athanor
// Tensors by name.
//
// File layout (safetensors): 8-byte little-endian header length N, N bytes of
// JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data block; offsets are relative to the data block.
//
// Invariants checked (a corrupt or truncated fixture throws FixtureError naming
// the file and the entry, so the test fails with a message instead of crashing):
//   - the header length fits in the file and the header is a JSON object;
//   - every entry has a known dtype, a shape of non-negative integers and
//     begin <= end <= data size with end - begin == numel * element size;
//   - the entries tile the data block exactly (no holes, no overlaps, no trailing bytes).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor::testing {

static_assert(std::endian::native == std::endian::little, "the fixture reader copies little-endian data as is");

class FixtureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

#ifdef ATHANOR_FIXTURES_DIR
inline std::string fixture_path(const std::string& file) { return std::string(ATHANOR_FIXTURES_DIR) + "/" + file; }
#endif

class Fixture {
 public:
  struct Entry {
    DType dtype;
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte range in the data block
  };

  // Reads and validates a whole file.
  static Fixture load(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw FixtureError("fixture " + path + ": cannot open the file\nhint: regenerate with `/usr/bin/python3 tools/make_fixtures.py`");
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return parse(std::move(bytes), path);
  }

  // Validates `bytes` (the content of a safetensors file); `source` names it in errors.
  static Fixture parse(std::string bytes, const std::string& source) {
    Fixture f;
    f.source_ = source;
    auto fail = [&](const std::string& what) -> FixtureError {
      return FixtureError("fixture " + source + ": " + what + " (file is " + std::to_string(bytes.size()) +
                          " bytes)\nhint: the file is corrupt or truncated; regenerate it with "
                          "`/usr/bin/python3 tools/make_fixtures.py`");
    };
    if (bytes.size() < 8) throw fail("shorter than the 8-byte header length");
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes.data(), 8);
    if (header_len > bytes.size() - 8)
      throw fail("header length " + std::to_string(header_len) + " runs past the end of the file");
    const nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len),
                                                        /*cb=*/nullptr, /*allow_exceptions=*/false);
    if (header.is_discarded()) throw fail("header is not valid JSON");
    if (!header.is_object()) throw fail("header is not a JSON object");
    const uint64_t data_size = bytes.size() - 8 - header_len;

    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& e = it.value();
      if (name == "__metadata__") {
        if (!e.is_object()) throw fail("__metadata__ is not an object");
        for (auto m = e.begin(); m != e.end(); ++m)
          if (m.value().is_string()) f.metadata_[m.key()] = m.value().get<std::string>();
        continue;
      }
      auto bad = [&](const std::string& what) { return fail("entry '" + name + "': " + what); };
      if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
        throw bad("needs dtype, shape and data_offsets");
      if (!e["dtype"].is_string()) throw bad("dtype is not a string");
      Entry entry;
      const std::string dt = e["dtype"].get<std::string>();
      if (dt == "F64") entry.dtype = DType::f64;
      else if (dt == "F32") entry.dtype = DType::f32;
      else if (dt == "I64") entry.dtype = DType::i64;
      else if (dt == "I32") entry.dtype = DType::i32;
      else throw bad("unsupported dtype '" + dt + "' (F64, F32, I64, I32)");
      if (!e["shape"].is_array()) throw bad("shape is not an array");
      uint64_t numel = 1;
      for (const auto& d : e["shape"]) {
        if (!d.is_number_unsigned()) throw bad("shape " + e["shape"].dump() + " has a non-integer or negative dim");
        const uint64_t n = d.get<uint64_t>();
        if (n != 0 && numel > (uint64_t{1} << 40) / n) throw bad("shape " + e["shape"].dump() + " is implausibly large");
        numel *= n;
        entry.shape.push_back(static_cast<int64_t>(n));
      }
      const auto& off = e["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw bad("data_offsets is not [begin, end]");
      entry.begin = off[0].get<uint64_t>();
      entry.end = off[1].get<uint64_t>();
      if (entry.begin > entry.end || entry.end > data_size)
        throw bad("data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                  "] outside the data block of " + std::to_string(data_size) + " bytes");
      const uint64_t want = numel * dtype_size(entry.dtype);
      if (entry.end - entry.begin != want)
        throw bad("holds " + std::to_string(entry.end - entry.begin) + " bytes but " + dt + " " + e["shape"].dump() +
                  " needs " + std::to_string(want));
      ranges.emplace_back(entry.begin, entry.end);
      f.entries_.emplace(name, std::move(entry));
    }
    std::sort(ranges.begin(), ranges.end());
    uint64_t pos = 0;
    for (const auto& [b, e] : ranges) {
      if (b != pos) throw fail(b < pos ? "entries overlap at byte " + std::to_string(b) : "hole in the data block at byte " + std::to_string(pos));
      pos = e;
    }
    if (pos != data_size)
      throw fail(std::to_string(data_size - pos) + " trailing bytes after the last entry");
    f.data_ = bytes.substr(8 + header_len);
    return f;
  }

  const std::string& source() const { return source_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const Entry& entry(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      std::ostringstream os;
      os << "fixture " << source_ << ": no tensor named '" << name << "'; it has:";
      for (const auto& [n, _] : entries_) os << " " << n;
      os << "\nhint: regenerate the fixtures (`/usr/bin/python3 tools/make_fixtures.py`) or fix the name";
      throw FixtureError(os.str());
    }
    return it->second;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, _] : entries_) out.push_back(n);
    return out;
  }

  // A new leaf tensor with the stored values, in the stored dtype or converted to `as`.
  Tensor get(const std::string& name, std::optional<DType> as = std::nullopt, bool requires_grad = false) const {
    const Entry& e = entry(name);
    Tensor t = empty(e.shape, TensorOptions(e.dtype));
    if (e.end > e.begin) std::memcpy(t.raw_data(), data_.data() + e.begin, e.end - e.begin);
    if (as && *as != e.dtype) {
      Tensor c = empty(e.shape, TensorOptions(*as));
      copy_into(c, t);
      t = c;
    }
    if (requires_grad) t.requires_grad_(true);
    return t;
  }

 private:
  std::string source_;
  std::string data_;  // the data block
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace athanor::testing
