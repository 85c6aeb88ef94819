// The CUDA backend's device hooks (core/device_hooks.h): CUDA tensors' memory from the
// caching device allocator, host <-> device copies through pinned host buffers on the
// copy stream, strided copies and fills on the compute stream. Installed at start-up by a
// static registrar; the link keeps this object because CMake passes
// -Wl,--undefined=athanor_cuda_device_hooks_anchor (a static library drops unreferenced
// objects, and with them their registrars).
//
// Stream order. A CUDA tensor's block belongs to the compute stream (the allocator's reuse
// is in its order), except an upload's (allocate_upload): that block belongs to the copy
// stream and is recorded as used on the compute stream (DeviceAllocator::record_stream), so
//  - the copy into it waits for nothing on the compute stream: the block was last freed
//    either by the copy stream itself (in its order) or after the compute stream's event
//    passed (the allocator's pending blocks), so no queued kernel can still touch it — the
//    next batch's upload overlaps the step still running;
//  - the compute stream waits for the copy's event before any later kernel (the contract:
//    a kernel queued after to(cuda) sees the bytes);
//  - when the tensor is freed, the block is reused only after the compute stream has run
//    every kernel queued before the free (the event the allocator records then).
// An upload into any other memory (copy_ into an existing tensor) first makes the copy
// stream wait for the compute stream (that block may have been freed by work still queued).
// The host bytes go through pinned buffers, each reused only once the copy that read it is
// done (an event query, never a wait), so an upload returns without waiting for the device;
// only an upload over 16 MiB (a model's weights), or one that finds the 64 MiB cache all in
// flight, cycles two fixed buffers and waits for them (counted host syncs).
// A download waits for the compute stream's queued work, and returns when the bytes are
// on the host; an error a kernel recorded (device_error.h) is raised then.
#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>
#include <vector>

#include "athanor/core/convert.h"
#include "athanor/core/device_hooks.h"
#include "athanor/core/error.h"
#include "backend/cuda/copy.h"
#include "backend/cuda/device_error.h"
#include "backend/cuda/host_reads.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/runtime.h"

extern "C" {
int athanor_cuda_device_hooks_anchor = 0;
}

namespace athanor::cuda {

namespace {

constexpr std::size_t kStagingBytes = std::size_t{4} << 20;  // per buffer; two per device
// The pinned cache for uploads: buffers of a power of two, at least kPinnedMin, at most
// kPinnedCap in all (a step's batches take a few; the steady state allocates none).
constexpr std::size_t kPinnedMin = std::size_t{64} << 10;
constexpr std::size_t kPinnedCap = std::size_t{64} << 20;
constexpr std::size_t kPinnedLargest = std::size_t{16} << 20;  // larger uploads (weights) take the fixed buffers

struct PinnedBuffer {
  void* ptr = nullptr;
  std::size_t size = 0;
  cudaEvent_t read = nullptr;  // recorded after the copy that read it: free once complete
};

// Per device: the pinned cache, two fixed pinned buffers for large copies, each with the
// event of the last copy that used it, and the marks that order the two streams.
struct Staging {
  std::mutex mu;
  bool ready = false;
  void* buf[2] = {nullptr, nullptr};
  cudaEvent_t used[2] = {nullptr, nullptr};
  cudaEvent_t compute_mark = nullptr, copy_done = nullptr;
  std::vector<PinnedBuffer> pinned;
  std::size_t pinned_bytes = 0;
  // A pinned buffer of at least n bytes no copy is reading any more (an event query: no
  // wait), a new one while the cache has room, else null.
  PinnedBuffer* pinned_for(int index, std::size_t n) {
    if (n > kPinnedLargest) return nullptr;
    PinnedBuffer* best = nullptr;
    for (PinnedBuffer& b : pinned) {
      if (b.size < n || (best && best->size <= b.size)) continue;
      const cudaError_t q = cudaEventQuery(b.read);
      if (q == cudaErrorNotReady) {
        cudaGetLastError();  // not an error: still being read
        continue;
      }
      if (q != cudaSuccess) fail_cuda(q, "cudaEventQuery", __FILE__, __LINE__);
      best = &b;
    }
    if (best) return best;
    const std::size_t size = std::max(kPinnedMin, std::bit_ceil(n));
    if (pinned_bytes + size > kPinnedCap) return nullptr;
    DeviceGuard g(index);
    PinnedBuffer b;
    b.size = size;
    ATH_CUDA(cudaMallocHost(&b.ptr, size));
    ATH_CUDA(cudaEventCreateWithFlags(&b.read, cudaEventDisableTiming));  // never recorded: complete
    pinned_bytes += size;
    pinned.push_back(b);
    return &pinned.back();
  }
  void init(int index) {
    if (ready) return;
    DeviceGuard g(index);
    for (int k = 0; k < 2; ++k) {
      ATH_CUDA(cudaMallocHost(&buf[k], kStagingBytes));
      ATH_CUDA(cudaEventCreateWithFlags(&used[k], cudaEventDisableTiming));
    }
    ATH_CUDA(cudaEventCreateWithFlags(&compute_mark, cudaEventDisableTiming));
    ATH_CUDA(cudaEventCreateWithFlags(&copy_done, cudaEventDisableTiming));
    ready = true;
  }
};
Staging& staging(int index) {
  static Staging all[64];  // never destroyed before the streams: both live as long as the process
  ATH_CHECK(index < 64, "cuda copy", "cuda:", index, " is past the 64 devices supported");
  return all[index];
}

StridedLayout layout_of(const StridedRegion& dst, const std::vector<int64_t>& src_strides, const char* op) {
  ATH_CHECK(static_cast<int>(dst.sizes.size()) <= kMaxCopyDims, op, "a ", dst.sizes.size(),
            "-D strided copy on cuda (at most ", kMaxCopyDims, " dims)", Hint{"reshape to fewer dims first"});
  StridedLayout l;
  l.ndim = static_cast<int>(dst.sizes.size());
  for (int i = 0; i < l.ndim; ++i) {
    l.sizes[i] = dst.sizes[i];
    l.dst_strides[i] = dst.strides[i];
    l.src_strides[i] = src_strides.empty() ? 0 : src_strides[i];
  }
  return l;
}
int64_t count(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

class CudaHooks final : public DeviceHooks {
 public:
  void check_device(int index, const char* op) override { cuda::check_device(index, op); }
  void* allocate(int index, std::size_t nbytes, MemTag tag) override {
    return DeviceAllocator::get(index).allocate(nbytes, tag);
  }
  void deallocate(int index, void* ptr) override { DeviceAllocator::get(index).deallocate(ptr); }
  void retag(int index, void* ptr, MemTag to) override { DeviceAllocator::get(index).retag(ptr, to); }

  void* allocate_upload(int index, std::size_t nbytes, MemTag tag) override {
    DeviceAllocator& a = DeviceAllocator::get(index);
    void* p = a.allocate(nbytes, tag, copy_stream(index));
    a.record_stream(p, compute_stream(index));  // every CUDA tensor is read by the compute stream
    return p;
  }

  void copy_to_device(void* dst, int index, const void* src, std::size_t nbytes) override {
    if (nbytes == 0) return;
    DeviceGuard g(index);
    Staging& s = staging(index);
    std::lock_guard<std::mutex> lock(s.mu);
    s.init(index);
    const cudaStream_t cs = compute_stream(index), xs = copy_stream(index);
    if (DeviceAllocator::get(index).stream_of(dst) != xs) {  // not an upload's own block: see the top
      ATH_CUDA(cudaEventRecord(s.compute_mark, cs));
      ATH_CUDA(cudaStreamWaitEvent(xs, s.compute_mark, 0));
    }
    const char* from = static_cast<const char*>(src);
    char* to = static_cast<char*>(dst);
    if (PinnedBuffer* b = s.pinned_for(index, nbytes)) {
      std::memcpy(b->ptr, from, nbytes);
      ATH_CUDA(cudaMemcpyAsync(to, b->ptr, nbytes, cudaMemcpyHostToDevice, xs));
      ATH_CUDA(cudaEventRecord(b->read, xs));
    } else {
      for (std::size_t off = 0, i = 0; off < nbytes; off += kStagingBytes, ++i) {
        const int k = static_cast<int>(i % 2);
        const std::size_t len = std::min(kStagingBytes, nbytes - off);
        note_host_sync(index);
        ATH_CUDA(cudaEventSynchronize(s.used[k]));  // the previous copy out of this buffer is done
        std::memcpy(s.buf[k], from + off, len);
        ATH_CUDA(cudaMemcpyAsync(to + off, s.buf[k], len, cudaMemcpyHostToDevice, xs));
        ATH_CUDA(cudaEventRecord(s.used[k], xs));
      }
    }
    ATH_CUDA(cudaEventRecord(s.copy_done, xs));
    ATH_CUDA(cudaStreamWaitEvent(cs, s.copy_done, 0));
  }

  void copy_to_host(void* dst, const void* src, int index, std::size_t nbytes) override {
    if (nbytes == 0) return;
    DeviceGuard g(index);
    Staging& s = staging(index);
    std::lock_guard<std::mutex> lock(s.mu);
    s.init(index);
    const cudaStream_t cs = compute_stream(index), xs = copy_stream(index);
    ATH_CUDA(cudaEventRecord(s.compute_mark, cs));
    ATH_CUDA(cudaStreamWaitEvent(xs, s.compute_mark, 0));
    const char* from = static_cast<const char*>(src);
    char* to = static_cast<char*>(dst);
    // The kernel-found error record (device_error.h) rides along: fetched before the bytes, so
    // the wait below covers it.
    fetch_device_errors(index, xs);
    const std::size_t chunks = (nbytes + kStagingBytes - 1) / kStagingBytes;
    auto issue = [&](std::size_t i) {
      const int k = static_cast<int>(i % 2);
      const std::size_t off = i * kStagingBytes, len = std::min(kStagingBytes, nbytes - off);
      ATH_CUDA(cudaMemcpyAsync(s.buf[k], from + off, len, cudaMemcpyDeviceToHost, xs));
      ATH_CUDA(cudaEventRecord(s.used[k], xs));
    };
    issue(0);
    note_host_sync(index);  // one read, however many chunks it waits for
    note_host_read_bytes(index, nbytes);
    for (std::size_t i = 0; i < chunks; ++i) {  // chunk i+1 is in flight while chunk i is copied out
      if (i + 1 < chunks) issue(i + 1);
      const int k = static_cast<int>(i % 2);
      const std::size_t off = i * kStagingBytes, len = std::min(kStagingBytes, nbytes - off);
      ATH_CUDA(cudaEventSynchronize(s.used[k]));
      std::memcpy(to + off, s.buf[k], len);
    }
    // The compute stream's work before this read is complete: an error a kernel recorded
    // there (an out-of-range class id) is raised now, with the value read (device_error.h).
    raise_device_errors(index);
  }

  void copy_between(void* dst, int dst_index, const void* src, int src_index, std::size_t nbytes) override {
    if (nbytes == 0) return;
    const cudaStream_t ds = compute_stream(dst_index);
    if (dst_index == src_index) {
      DeviceGuard g(dst_index);
      ATH_CUDA(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, ds));
      return;
    }
    // The source's queued writes first: the destination's stream waits for the source's.
    cudaEvent_t ev = nullptr;
    {
      DeviceGuard g(src_index);
      ATH_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      ATH_CUDA(cudaEventRecord(ev, compute_stream(src_index)));
    }
    DeviceGuard g(dst_index);
    ATH_CUDA(cudaStreamWaitEvent(ds, ev, 0));
    ATH_CUDA(cudaMemcpyPeerAsync(dst, dst_index, src, src_index, nbytes, ds));
    ATH_CUDA(cudaEventDestroy(ev));  // released once the wait is done
  }

  void copy_strided(const StridedRegion& dst, const StridedRegion& src, int index, const char* op) override {
    ATH_CHECK(can_copy(src.dtype, dst.dtype), op, "converting ", dtype_name(src.dtype), " to ", dtype_name(dst.dtype),
              " is not yet supported on cuda (only between f32, f64, bf16 and f16, or within one dtype)",
              Hint{"convert on the CPU (.cpu().to(dtype)) and move the result"});
    const int64_t n = count(dst.sizes);
    if (n == 0) return;
    DeviceGuard g(index);
    cuda::copy_strided(dst.data, dst.dtype, src.data, src.dtype, layout_of(dst, src.strides, op), n, compute_stream(index));
  }

  void fill(const StridedRegion& dst, double value, int index) override {
    const int64_t n = count(dst.sizes);
    if (n == 0) return;
    uint64_t pattern = 0;
    dispatch(dst.dtype, [&]<class T>() {
      const T v = cast_value<T>(value);
      std::memcpy(&pattern, &v, sizeof(T));
    });
    DeviceGuard g(index);
    fill_pattern(dst.data, static_cast<int>(dtype_size(dst.dtype)), pattern, layout_of(dst, {}, "fill_"), n,
                 compute_stream(index));
  }

  void add_into(void* acc, const void* g, DType dtype, int64_t n, int index, const char* op) override {
    ATH_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16, op,
              "adding ", dtype_name(dtype), " tensors is not yet supported on cuda",
              Hint{"accumulate floating-point gradients only"});
    DeviceGuard guard(index);
    add_inplace(acc, g, dtype, n, compute_stream(index));
  }

  std::uint64_t host_syncs(int index) const override { return host_sync_count(index); }

  std::uint64_t record_mark(int index) override {
    Mark* m = nullptr;
    {
      std::lock_guard<std::mutex> lock(marks_mu_);
      if (!free_marks_.empty()) {
        m = free_marks_.back();
        free_marks_.pop_back();
      }
    }
    DeviceGuard g(index);
    if (!m || m->device != index) {
      if (m) {  // a mark of another device: left to that device
        std::lock_guard<std::mutex> lock(marks_mu_);
        free_marks_.push_back(m);
      }
      m = new Mark{index, nullptr};  // lives as long as the process (a small pool)
      ATH_CUDA(cudaEventCreate(&m->event));  // with timing
    }
    ATH_CUDA(cudaEventRecord(m->event, compute_stream(index)));
    return reinterpret_cast<std::uint64_t>(m);
  }
  int64_t mark_elapsed_ns(std::uint64_t a, std::uint64_t b) override {
    const Mark* ma = reinterpret_cast<const Mark*>(a);
    const Mark* mb = reinterpret_cast<const Mark*>(b);
    if (!ma || !mb) return -1;
    DeviceGuard g(mb->device);
    note_host_sync(mb->device);
    ATH_CUDA(cudaEventSynchronize(mb->event));
    float ms = 0;
    ATH_CUDA(cudaEventElapsedTime(&ms, ma->event, mb->event));
    return static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  }
  void release_mark(std::uint64_t m) override {
    if (!m) return;
    std::lock_guard<std::mutex> lock(marks_mu_);
    free_marks_.push_back(reinterpret_cast<Mark*>(m));
  }

 private:
  struct Mark {
    int device;
    cudaEvent_t event;
  };
  std::mutex marks_mu_;
  std::vector<Mark*> free_marks_;
};

struct Registrar {
  Registrar() {
    static CudaHooks hooks;
    set_device_hooks(DeviceType::cuda, &hooks);
  }
};
const Registrar registrar;

}  // namespace

}  // namespace athanor::cuda
