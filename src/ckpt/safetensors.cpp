#include "athanor/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "athanor/core/error.h"
#include "ckpt/safetensors_write.h"
#include "ckpt/staged_file_writer.h"

namespace athanor::ckpt {
namespace {
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; big-endian hosts need byte swaps");

constexpr uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's bound

const char* st_dtype(DType d) {
  switch (d) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

struct StDtype {
  DType dtype;
  size_t bytes;
  bool is_u16 = false;
};
bool from_st_dtype(const std::string& s, StDtype& out) {
  static const std::map<std::string, StDtype> table = {
      {"F64", {DType::f64, 8}}, {"F32", {DType::f32, 4}},   {"F16", {DType::f16, 2}}, {"BF16", {DType::bf16, 2}},
      {"I64", {DType::i64, 8}}, {"I32", {DType::i32, 4}},   {"U16", {DType::i32, 2, true}},
      {"U8", {DType::u8, 1}},   {"BOOL", {DType::boolean, 1}}};
  auto it = table.find(s);
  if (it == table.end()) return false;
  out = it->second;
  return true;
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  write_safetensors(path, tensors, metadata, ByteSink());
}

uint64_t write_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                           const ByteSink& sink) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  std::vector<Tensor> data;
  for (const auto& [name, t] : tensors) {
    ATH_CHECK(names.insert(name).second, "save_safetensors", path, ": tensor name '", name, "' appears twice");
    ATH_CHECK(name != "__metadata__", "save_safetensors", path, ": '__metadata__' is reserved");
    Tensor c = t.is_contiguous() ? t : t.contiguous();
    const uint64_t n = c.nbytes();
    header[name] = {{"dtype", st_dtype(c.dtype())}, {"shape", c.sizes()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    data.push_back(c);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();

  const std::string tmp = path + ".tmp";
  // Every byte written also goes to the sink (a checksum), in the order of the file, a
  // piece at a time so that the sink reads what the writer has just brought into cache.
  try {
    StagedFileWriter out(tmp, "save_safetensors");
    constexpr size_t kPiece = size_t{1} << 20;
    auto put = [&](const void* p, size_t n) {
      for (const char* c = static_cast<const char*>(p); n > 0;) {
        const size_t k = std::min(n, kPiece);
        out.write(c, k);
        if (sink) sink(c, k);
        c += k, n -= k;
      }
    };
    put(&len, 8);
    put(text.data(), text.size());
    for (const Tensor& t : data) put(t.raw_data(), t.nbytes());
    out.finish();
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  ATH_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "save_safetensors", "cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
  return 8 + len + offset;
}

namespace {
// A read-only file mapped copy-on-write (MAP_PRIVATE): tensors may view it
// without copying, an in-place write to such a tensor touches a private page,
// never the file. Unmapped when the last viewing tensor goes away.
class FileMap {
 public:
  FileMap(void* p, size_t n) : p_(p), n_(n) {}
  ~FileMap() { ::munmap(p_, n_); }
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;
  const char* data() const { return static_cast<const char*>(p_); }
  size_t size() const { return n_; }

 private:
  void* p_;
  size_t n_;
};

struct EntryLocation {
  std::string name;
  DType dtype;
  bool is_u16;
  Shape shape;
  uint64_t begin, end;  // relative to the data block
};

// `map` (null for plain memory) lets tensors alias the bytes instead of copying them.
// With `locations`, only the header is validated (data holds at least 8 + header
// length bytes; `size` is the whole file's) and the entries are listed, not read.
SafetensorsFile parse_bytes(const char* data, size_t size, const std::string& src, const std::shared_ptr<FileMap>& map,
                            std::vector<EntryLocation>* locations = nullptr) {
  const char* op = "load_safetensors";
  ATH_CHECK(size >= 8, op, src, ": file is ", size, " bytes, too short for the 8-byte header length",
            Hint{"the file is truncated or not a safetensors file"});
  uint64_t len;
  std::memcpy(&len, data, 8);
  ATH_CHECK(len <= kMaxHeader, op, src, ": header length ", len, " exceeds the 100 MiB limit", Hint{"the file is corrupt or not a safetensors file"});
  ATH_CHECK(len <= size - 8, op, src, ": header length ", len, " is larger than the file (", size, " bytes)",
            Hint{"the file is truncated or corrupt"});
  // Parse with a callback that rejects duplicate top-level names (plain JSON parsing keeps the last).
  std::set<std::string> seen;
  std::string dup;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(
        data + 8, data + 8 + len,
        [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& j) {
          if (depth == 1 && ev == nlohmann::json::parse_event_t::key && !seen.insert(j.get<std::string>()).second && dup.empty())
            dup = j.get<std::string>();
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    ATH_FAIL(op, src, ": the header is not valid JSON (", e.what(), ")", Hint{"the file is corrupt"});
  }
  ATH_CHECK(dup.empty(), op, src, ": tensor '", dup, "' appears twice in the header");
  ATH_CHECK(header.is_object(), op, src, ": the header must be a JSON object");
  const uint64_t data_size = size - 8 - len;
  const char* base = data + 8 + len;

  SafetensorsFile out;
  struct Item {
    uint64_t begin, end;
    std::string name;
    StDtype dt;
    Shape shape;
  };
  std::vector<Item> items;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& e = it.value();
    if (name == "__metadata__") {
      ATH_CHECK(e.is_object(), op, src, ": __metadata__ must be an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        ATH_CHECK(m.value().is_string(), op, src, ": __metadata__ value '", m.key(), "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    ATH_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), op, src, ": entry '",
              name, "' needs dtype, shape and data_offsets");
    Item item{0, 0, name, {}, {}};
    ATH_CHECK(e["dtype"].is_string() && from_st_dtype(e["dtype"].get<std::string>(), item.dt), op, src, ": entry '", name,
              "' has unsupported dtype ", e["dtype"].dump(), Hint{"supported: F64 F32 F16 BF16 I64 I32 U16 U8 BOOL"});
    ATH_CHECK(e["shape"].is_array(), op, src, ": entry '", name, "' shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      ATH_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), op, src, ": entry '", name,
                "' has an invalid dimension ", d.dump());
      const uint64_t v = d.get<uint64_t>();
      ATH_CHECK(v == 0 || numel <= (1ull << 62) / v, op, src, ": entry '", name, "' shape overflows");
      numel *= v;
      item.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = e["data_offsets"];
    ATH_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), op, src,
              ": entry '", name, "' data_offsets must be [begin, end]");
    item.begin = off[0].get<uint64_t>();
    item.end = off[1].get<uint64_t>();
    ATH_CHECK(item.begin <= item.end && item.end <= data_size, op, src, ": entry '", name, "' data_offsets [", item.begin, ", ",
              item.end, "] fall outside the data block of ", data_size, " bytes", Hint{"the file is truncated or corrupt"});
    ATH_CHECK(item.end - item.begin == numel * item.dt.bytes, op, src, ": entry '", name, "' has ", item.end - item.begin,
              " bytes but shape ", shape_str(item.shape), " of ", e["dtype"].get<std::string>(), " needs ", numel * item.dt.bytes);
    items.push_back(std::move(item));
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t expect = 0;
  for (const Item& i : items) {
    ATH_CHECK(i.begin == expect, op, src, ": entry '", i.name, "' starts at byte ", i.begin, " but the previous entry ends at ",
              expect, i.begin < expect ? " (entries overlap)" : " (a gap)", Hint{"the file is corrupt"});
    expect = i.end;
  }
  ATH_CHECK(expect == data_size, op, src, ": the entries cover ", expect, " bytes of a ", data_size, "-byte data block",
            Hint{"the file has trailing bytes or is corrupt"});
  if (locations) {
    for (const Item& i : items) locations->push_back({i.name, i.dt.dtype, i.dt.is_u16, i.shape, i.begin, i.end});
    return out;
  }
  for (const Item& i : items) {
    const char* src_bytes = base + i.begin;
    Tensor t;
    const bool aliasable = map && !i.dt.is_u16 && i.end > i.begin &&
                           reinterpret_cast<uintptr_t>(src_bytes) % i.dt.bytes == 0;
    if (aliasable) {
      auto impl = std::make_shared<TensorImpl>();
      impl->storage = Storage::wrap(const_cast<char*>(src_bytes), i.end - i.begin, [map](void*) {});
      impl->sizes = i.shape;
      impl->strides = contiguous_strides(i.shape);
      impl->dtype = i.dt.dtype;
      t = Tensor(std::move(impl));
    } else {
      t = empty(i.shape, TensorOptions(i.dt.dtype));
      if (i.dt.is_u16) {
        int32_t* d = t.data_ptr<int32_t>();
        for (int64_t k = 0; k < t.numel(); ++k) {
          uint16_t v;
          std::memcpy(&v, src_bytes + 2 * k, 2);
          d[k] = v;
        }
      } else if (t.nbytes() > 0) {
        std::memcpy(t.raw_data(), src_bytes, t.nbytes());
      }
    }
    if (i.dt.dtype == DType::boolean) {
      const uint8_t* b = static_cast<const uint8_t*>(t.raw_data());
      for (int64_t k = 0; k < t.numel(); ++k)
        ATH_CHECK(b[k] <= 1, op, src, ": entry '", i.name, "' is BOOL but holds the byte ", int(b[k]));
    }
    out.tensors.emplace_back(i.name, t);
  }
  return out;
}
}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source) {
  return parse_bytes(bytes.data(), bytes.size(), source, nullptr);
}

namespace {
// An open regular file (closed on scope exit) and its size; errors name `op` and the path.
struct ReadableFile {
  int fd = -1;
  size_t size = 0;
  ReadableFile(const std::string& path, const char* op) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ATH_CHECK(fd >= 0, op, "cannot open '", path, "': ", std::strerror(errno), Hint{"check the path"});
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const std::string why = S_ISREG(st.st_mode) ? std::strerror(errno) : "not a regular file";
      ::close(fd);
      ATH_FAIL(op, "cannot read '", path, "': ", why, Hint{"give the path of a .safetensors file"});
    }
    size = static_cast<size_t>(st.st_size);
  }
  ~ReadableFile() { ::close(fd); }
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;
};
}  // namespace

SafetensorsFile load_safetensors(const std::string& path) {
  const char* op = "load_safetensors";
  const ReadableFile file(path, op);
  const int fd = file.fd;
  const size_t size = file.size;
  if (size >= kSafetensorsMmapThreshold) {
    // The map outlives the fd; tensors alias it (no read into a temporary buffer).
    // MAP_POPULATE: the whole file is wanted (checkpoint loads copy every byte), and
    // mapping it in one call is several times faster than one page fault per 4 KiB.
    // Mapped read-only first so populating shares the page cache instead of copying
    // every page (populate breaks copy-on-write in a writable private map); write
    // access is added afterwards so an in-place op on a tensor copies just its pages.
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p != MAP_FAILED && ::mprotect(p, size, PROT_READ | PROT_WRITE) != 0) {
      ::munmap(p, size);
      p = MAP_FAILED;
    }
    if (p != MAP_FAILED) {
      auto map = std::make_shared<FileMap>(p, size);
      return parse_bytes(map->data(), map->size(), path, map);
    }
    // mmap can fail on some filesystems: fall back to read().
  }
  std::string bytes(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t r = ::read(fd, bytes.data() + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    ATH_CHECK(r >= 0, op, "cannot read '", path, "': ", std::strerror(errno));
    if (r == 0) break;  // shrank while reading: parse what is there (validation reports it)
    got += static_cast<size_t>(r);
  }
  bytes.resize(got);
  return parse_bytes(bytes.data(), bytes.size(), path, nullptr);
}

void load_safetensors_into(const std::string& path, const NamedTensors& dst) {
  const char* op = "load_safetensors_into";
  const ReadableFile file(path, op);
  const int fd = file.fd;
  const size_t size = file.size;
  auto pread_all = [&](void* to, size_t n, uint64_t at) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, static_cast<char*>(to) + got, n - got, static_cast<off_t>(at + got));
      if (r < 0 && errno == EINTR) continue;
      ATH_CHECK(r > 0, op, "cannot read '", path, "' at byte ", at + got, ": ", r < 0 ? std::strerror(errno) : "unexpected end of file",
                Hint{"the file is truncated or unreadable"});
      got += static_cast<size_t>(r);
    }
  };
  // The header is validated exactly as load_safetensors does (offsets against the file size).
  uint64_t len = 0;
  if (size >= 8) pread_all(&len, 8, 0);
  std::string head(size >= 8 ? 8 + static_cast<size_t>(std::min<uint64_t>(len, std::min<uint64_t>(kMaxHeader, size - 8))) : size, '\0');
  if (!head.empty()) pread_all(head.data(), head.size(), 0);
  std::vector<EntryLocation> entries;
  parse_bytes(head.data(), size, path, nullptr, &entries);
  const uint64_t base = 8 + len;

  std::map<std::string, const EntryLocation*> by_name;
  for (const auto& e : entries) by_name[e.name] = &e;
  std::string missing, mismatched;
  for (const auto& [name, t] : dst) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    const EntryLocation& e = *it->second;
    if (e.shape != t.sizes() || e.dtype != t.dtype() || e.is_u16 || !t.is_contiguous())
      mismatched += (mismatched.empty() ? "" : ", ") + name + " (file " + shape_str(e.shape) + " " + dtype_name(e.dtype) + ", tensor " +
                    t.describe() + ")";
  }
  ATH_CHECK(missing.empty(), op, path, ": missing tensors: ", missing, Hint{"the file was written for another model"});
  ATH_CHECK(mismatched.empty(), op, path, ": tensors that do not fit: ", mismatched, Hint{"the file was written for another model"});
  ATH_CHECK(by_name.size() == dst.size(), op, path, ": holds ", by_name.size(), " tensors, the destination ", dst.size(),
            Hint{"the file was written for another model; use load_safetensors to read it as it is"});
  // One copy, from the page cache straight into each destination (what read() costs).
  for (const auto& [name, t] : dst) {
    const EntryLocation& e = *by_name.at(name);
    if (e.end > e.begin) pread_all(t.raw_data(), e.end - e.begin, base + e.begin);
    if (e.dtype == DType::boolean) {
      const uint8_t* b = static_cast<const uint8_t*>(t.raw_data());
      for (int64_t k = 0; k < t.numel(); ++k)
        ATH_CHECK(b[k] <= 1, op, path, ": entry '", name, "' is BOOL but holds the byte ", int(b[k]));
    }
    t.bump_version();
  }
}

}  // namespace athanor::ckpt
