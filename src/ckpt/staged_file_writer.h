#pragma once
// Writes a new file at the disk's speed, for checkpoints. The bytes are copied into two
// aligned staging buffers; while the caller fills one, a background thread writes the other
// with O_DIRECT, so the data goes from the buffer to the device without a copy into the page
// cache (that copy, not the disk, bounded the buffered writer) and without dirtying gigabytes
// of cache that writeback throttling then charges to the writer. Where the filesystem refuses
// O_DIRECT (tmpfs, some FUSE/network filesystems) it writes the same buffers with plain
// write()s, starting each buffer's writeback as soon as it is written.
#include <cstddef>
#include <cstdint>
#include <future>
#include <string>

namespace athanor::ckpt {

class StagedFileWriter {
 public:
  // Creates (or truncates) `path`. `op` names the caller in errors ("save_safetensors").
  StagedFileWriter(const std::string& path, const char* op);
  ~StagedFileWriter();  // an unfinished file is closed as it is; the caller removes it
  StagedFileWriter(const StagedFileWriter&) = delete;
  StagedFileWriter& operator=(const StagedFileWriter&) = delete;

  void write(const void* data, std::size_t n);
  // Writes what is staged, sets the file's exact size, fsyncs and closes it. Returns the size.
  uint64_t finish();
  // Whether the data went around the page cache (O_DIRECT).
  bool direct() const { return direct_; }

  static constexpr std::size_t kAlign = 4096;            // O_DIRECT's offset/size/address unit
  static constexpr std::size_t kBuffer = std::size_t{16} << 20;  // each of the two buffers

 private:
  void submit();                        // hands the full current buffer to the writer thread
  void wait_in_flight();                // rethrows the writer thread's error
  void write_at(const char* p, std::size_t n, uint64_t offset);  // the writer thread's pwrite loop

  std::string path_;
  const char* op_;
  int fd_ = -1;
  bool direct_ = false;
  char* buffers_[2] = {nullptr, nullptr};
  int current_ = 0;
  std::size_t filled_ = 0;   // bytes in buffers_[current_]
  uint64_t offset_ = 0;      // file offset of buffers_[current_]
  std::future<void> in_flight_;
};

}  // namespace athanor::ckpt
