// NCCL communicators on the communication stream (contract in nccl_comm.h).
#include "backend/cuda/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <sstream>

#include "athanor/core/error.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {

const char* nccl_hint(ncclResult_t r) {
  switch (r) {
    case ncclInvalidUsage:
      return "NCCL refuses this use: two ranks on one GPU (one process per GPU: dist.backend mpi shares a GPU through host "
             "staging), or ranks calling different collectives";
    case ncclSystemError:
    case ncclRemoteError:
      return "a peer or the network failed (a rank died, or NCCL cannot reach it): NCCL_DEBUG=INFO says which";
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: rerun with NCCL_DEBUG=INFO and CUDA_LAUNCH_BLOCKING=1";
    default:
      return "rerun with NCCL_DEBUG=INFO for NCCL's own account";
  }
}

[[noreturn]] void fail_nccl(ncclResult_t r, const char* call, const char* file, int line, ncclComm_t comm = nullptr) {
  std::ostringstream os;
  os << call << " failed: " << ncclGetErrorString(r);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) os << " (" << last << ")";
  }
  os << " at " << file << ":" << line;
  ATH_FAIL("nccl", os.str(), Hint{nccl_hint(r)});
}

#define ATH_NCCL(call, comm)                                                          \
  do {                                                                                \
    const ncclResult_t ath_r_ = (call);                                               \
    if (ath_r_ != ncclSuccess && ath_r_ != ncclInProgress) fail_nccl(ath_r_, #call, __FILE__, __LINE__, comm); \
  } while (0)

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8:
    case DType::boolean: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(NcclReduce op) {
  switch (op) {
    case NcclReduce::sum: return ncclSum;
    case NcclReduce::avg: return ncclAvg;
    case NcclReduce::max: return ncclMax;
  }
  return ncclSum;
}

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  ATH_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

}  // namespace

NcclId nccl_unique_id() {
  ncclUniqueId id;
  ATH_NCCL(ncclGetUniqueId(&id), nullptr);
  NcclId out;
  static_assert(sizeof(id.internal) == kNcclIdBytes);
  std::memcpy(out.data(), id.internal, kNcclIdBytes);
  return out;
}

int nccl_version() {
  int v = 0;
  ATH_NCCL(ncclGetVersion(&v), nullptr);
  return v;
}

std::string nccl_version_string() {
  const int v = nccl_version();
  // NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z from 2.9 on.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

NcclOp::~NcclOp() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));  // released once it completes
}

NcclComm::NcclComm(const NcclId& id, int nranks, int rank, int device) : device_(device), rank_(rank), nranks_(nranks) {
  require_device(device, "nccl");  // also makes it current: NCCL binds the communicator to it
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), kNcclIdBytes);
  ncclComm_t c = nullptr;
  ATH_NCCL(ncclCommInitRank(&c, nranks, uid, rank), nullptr);
  comm_ = c;
  cudaStream_t s = nullptr;
  ATH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  ready_ = new_event();
}

NcclComm::~NcclComm() {
  DeviceGuard g(device_);
  if (comm_ && !aborted_) {
    // Whatever is still queued finishes first (destroying under a running kernel is undefined).
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    ncclCommDestroy(static_cast<ncclComm_t>(comm_));
  }
  if (ready_) cudaEventDestroy(static_cast<cudaEvent_t>(ready_));
  if (stream_ && !aborted_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

template <class F>
std::unique_ptr<NcclOp> NcclComm::enqueue(const char* what, F&& call) {
  ATH_CHECK(!aborted_, "nccl", what, " on a communicator that was aborted (a collective timed out)");
  DeviceGuard g(device_);
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto ready = static_cast<cudaEvent_t>(ready_);
  // The communication stream starts after everything queued so far on the compute stream:
  // the kernels that wrote the buffers (gradients, the bucket's copy) come first.
  ATH_CUDA(cudaEventRecord(ready, compute_stream(device_)));
  ATH_CUDA(cudaStreamWaitEvent(s, ready, 0));
  call(static_cast<ncclComm_t>(comm_), s);
  cudaEvent_t done = new_event();
  ATH_CUDA(cudaEventRecord(done, s));
  return std::make_unique<NcclOp>(done, device_);
}

std::unique_ptr<NcclOp> NcclComm::all_reduce(const void* send, void* recv, int64_t count, DType dt, NcclReduce op) {
  return enqueue("all_reduce", [&](ncclComm_t c, cudaStream_t s) {
    ATH_NCCL(ncclAllReduce(send, recv, static_cast<size_t>(count), nccl_type(dt), nccl_op(op), c, s), c);
  });
}

std::unique_ptr<NcclOp> NcclComm::reduce_scatter(const void* send, void* recv, int64_t count, DType dt, NcclReduce op) {
  return enqueue("reduce_scatter", [&](ncclComm_t c, cudaStream_t s) {
    ATH_NCCL(ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type(dt), nccl_op(op), c, s), c);
  });
}

std::unique_ptr<NcclOp> NcclComm::all_gather(const void* send, void* recv, int64_t count, DType dt) {
  return enqueue("all_gather", [&](ncclComm_t c, cudaStream_t s) {
    ATH_NCCL(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(dt), c, s), c);
  });
}

std::unique_ptr<NcclOp> NcclComm::broadcast(void* buf, int64_t count, DType dt, int root) {
  return enqueue("broadcast", [&](ncclComm_t c, cudaStream_t s) {
    ATH_NCCL(ncclBroadcast(buf, buf, static_cast<size_t>(count), nccl_type(dt), root, c, s), c);
  });
}

std::unique_ptr<NcclOp> NcclComm::send(const void* buf, int64_t count, DType dt, int peer) {
  return enqueue("send", [&](ncclComm_t c, cudaStream_t s) {
    ATH_NCCL(ncclSend(buf, static_cast<size_t>(count), nccl_type(dt), peer, c, s), c);
  });
}

std::unique_ptr<NcclOp> NcclComm::recv(void* buf, int64_t count, DType dt, int peer) {
  return enqueue("recv", [&](ncclComm_t c, cudaStream_t s) {
    ATH_NCCL(ncclRecv(buf, static_cast<size_t>(count), nccl_type(dt), peer, c, s), c);
  });
}

bool NcclComm::done(const NcclOp& op) {
  DeviceGuard g(device_);
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(op.event()));
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) fail_cuda(e, "cudaEventQuery (an NCCL operation)", __FILE__, __LINE__);
  if (!aborted_) {
    ncclResult_t async = ncclSuccess;
    ATH_NCCL(ncclCommGetAsyncError(static_cast<ncclComm_t>(comm_), &async), static_cast<ncclComm_t>(comm_));
    if (async != ncclSuccess && async != ncclInProgress)
      fail_nccl(async, "an NCCL operation (ncclCommGetAsyncError)", __FILE__, __LINE__, static_cast<ncclComm_t>(comm_));
  }
  return false;
}

void NcclComm::finish(const NcclOp& op) {
  DeviceGuard g(device_);
  ATH_CUDA(cudaStreamWaitEvent(compute_stream(device_), static_cast<cudaEvent_t>(op.event()), 0));
}

void NcclComm::abort() {
  if (aborted_ || !comm_) return;
  aborted_ = true;
  DeviceGuard g(device_);
  ncclCommAbort(static_cast<ncclComm_t>(comm_));
}

std::string NcclComm::async_error() {
  if (!comm_ || aborted_) return "";
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(static_cast<ncclComm_t>(comm_), &async) != ncclSuccess) return "";
  return async == ncclSuccess || async == ncclInProgress ? "" : ncclGetErrorString(async);
}

}  // namespace athanor::cuda
