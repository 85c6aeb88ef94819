// StagedFileWriter: see staged_file_writer.h.
#include "ckpt/staged_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "athanor/core/error.h"

namespace athanor::ckpt {

StagedFileWriter::StagedFileWriter(const std::string& path, const char* op) : path_(path), op_(op) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ATH_CHECK(fd_ >= 0, op_, path_, ": cannot create: ", std::strerror(errno), Hint{"check that the directory exists and is writable"});
  for (char*& b : buffers_) {
    b = static_cast<char*>(std::aligned_alloc(kAlign, kBuffer));
    ATH_CHECK(b != nullptr, op_, path_, ": cannot allocate the ", kBuffer >> 20, " MiB staging buffers");
  }
  if (direct_) {
    // Some filesystems accept O_DIRECT at open and refuse it at the first write: probe with
    // one aligned block (overwritten by the data, and the size is set at finish).
    std::memset(buffers_[0], 0, kAlign);
    if (::pwrite(fd_, buffers_[0], kAlign, 0) != static_cast<ssize_t>(kAlign)) {
      ATH_CHECK(errno == EINVAL, op_, path_, ": write failed: ", std::strerror(errno), Hint{"check free disk space and permissions"});
      ATH_CHECK(::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT) == 0, op_, path_,
                ": cannot leave O_DIRECT: ", std::strerror(errno));
      direct_ = false;
    }
  }
}

StagedFileWriter::~StagedFileWriter() {
  if (in_flight_.valid()) in_flight_.wait();  // the thread reads buffers_: never free under it
  if (fd_ >= 0) ::close(fd_);
  for (char* b : buffers_) std::free(b);
}

void StagedFileWriter::write_at(const char* p, std::size_t n, uint64_t offset) {
  const uint64_t start = offset;
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    ATH_CHECK(w > 0, op_, path_, ": write failed: ", std::strerror(errno), Hint{"check free disk space and permissions"});
    p += w, n -= static_cast<std::size_t>(w), offset += static_cast<uint64_t>(w);
  }
  // Buffered: start this range's writeback now, so that the closing fsync waits only for the
  // tail instead of the whole file. (O_DIRECT data is already on its way to the device.)
  if (!direct_) ::sync_file_range(fd_, static_cast<off64_t>(start), static_cast<off64_t>(offset - start), SYNC_FILE_RANGE_WRITE);
}

void StagedFileWriter::wait_in_flight() {
  if (in_flight_.valid()) in_flight_.get();
}

void StagedFileWriter::submit() {
  wait_in_flight();  // the other buffer is free again once its write has returned
  const char* p = buffers_[current_];
  const std::size_t n = filled_;
  const uint64_t at = offset_;
  in_flight_ = std::async(std::launch::async, [this, p, n, at] { write_at(p, n, at); });
  offset_ += n;
  filled_ = 0;
  current_ ^= 1;
}

void StagedFileWriter::write(const void* data, std::size_t n) {
  const char* c = static_cast<const char*>(data);
  while (n > 0) {
    const std::size_t k = std::min(n, kBuffer - filled_);
    std::memcpy(buffers_[current_] + filled_, c, k);
    filled_ += k, c += k, n -= k;
    if (filled_ == kBuffer) submit();
  }
}

uint64_t StagedFileWriter::finish() {
  const uint64_t size = offset_ + filled_;
  wait_in_flight();
  if (filled_ > 0) {
    // O_DIRECT writes whole aligned blocks: pad the tail with zeros and cut the file back.
    const std::size_t n = direct_ ? (filled_ + kAlign - 1) / kAlign * kAlign : filled_;
    std::memset(buffers_[current_] + filled_, 0, n - filled_);
    write_at(buffers_[current_], n, offset_);
  }
  ATH_CHECK(::ftruncate(fd_, static_cast<off_t>(size)) == 0, op_, path_, ": cannot set its size: ", std::strerror(errno));
  ATH_CHECK(::fsync(fd_) == 0, op_, path_, ": fsync failed: ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  ATH_CHECK(::close(fd) == 0, op_, path_, ": close failed: ", std::strerror(errno));
  return size;
}

}  // namespace athanor::ckpt
