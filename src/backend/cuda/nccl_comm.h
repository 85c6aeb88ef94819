#pragma once
// One NCCL communicator on one device, with its own communication stream (DESIGN.md
// "Distributed": CUDA tensors use NCCL, bootstrapped over MPI by src/dist). Compiled only in
// a build with CUDA and NCCL (ATHANOR_HAS_NCCL); this header names no CUDA or NCCL type, so
// src/dist can hold a communicator without their headers.
//
// Invariants:
//  - every operation is enqueued on the communicator's stream after the work queued so far
//    on the device's compute stream (an event recorded there, waited for by the
//    communication stream): the kernels that produced a buffer run before NCCL reads it;
//  - an operation returns an NcclOp whose event is recorded on the communication stream
//    after the NCCL call; done() polls it without blocking (and turns an asynchronous NCCL
//    error into an Error), finish() orders the compute stream after it (work queued on the
//    compute stream afterwards sees the result);
//  - abort() (ncclCommAbort) ends the communicator's kernels whatever their peers do: the
//    watchdog's first act when a collective is past its timeout; afterwards the
//    communicator is unusable and is not destroyed again.
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

constexpr std::size_t kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
using NcclId = std::array<char, kNcclIdBytes>;

enum class NcclReduce { sum, avg, max };

NcclId nccl_unique_id();   // ncclGetUniqueId (rank 0 of a group calls it)
int nccl_version();        // the loaded library's, as 22809 = 2.28.9
std::string nccl_version_string();

// An enqueued operation: the event after it on the communication stream.
class NcclOp {
 public:
  NcclOp(void* event, int device) : event_(event), device_(device) {}
  ~NcclOp();
  NcclOp(const NcclOp&) = delete;
  NcclOp& operator=(const NcclOp&) = delete;
  void* event() const { return event_; }
  int device() const { return device_; }

 private:
  void* event_;
  int device_;
};

class NcclComm {
 public:
  // ncclCommInitRank on cuda:device (every rank of the group calls it with the same id).
  NcclComm(const NcclId& id, int nranks, int rank, int device);
  ~NcclComm();  // ncclCommDestroy (not after abort())
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return nranks_; }

  // Buffers are device pointers on device(); counts in elements of `dt`.
  std::unique_ptr<NcclOp> all_reduce(const void* send, void* recv, int64_t count, DType dt, NcclReduce op);
  // recv: count elements; send: nranks x count.
  std::unique_ptr<NcclOp> reduce_scatter(const void* send, void* recv, int64_t count, DType dt, NcclReduce op);
  // send: count elements; recv: nranks x count, rank r's at [r * count, (r+1) * count).
  std::unique_ptr<NcclOp> all_gather(const void* send, void* recv, int64_t count, DType dt);
  std::unique_ptr<NcclOp> broadcast(void* buf, int64_t count, DType dt, int root);
  std::unique_ptr<NcclOp> send(const void* buf, int64_t count, DType dt, int peer);
  std::unique_ptr<NcclOp> recv(void* buf, int64_t count, DType dt, int peer);

  // True once the operation completed on the device; an asynchronous NCCL error (a peer's
  // network failure, an abort) is an Error naming it.
  bool done(const NcclOp& op);
  // The compute stream waits for the operation (no host wait).
  void finish(const NcclOp& op);
  // ncclCommAbort: every kernel of this communicator returns; the communicator is dead.
  void abort();
  bool aborted() const { return aborted_; }
  // "" or the communicator's asynchronous error in NCCL's words.
  std::string async_error();

 private:
  template <class F> std::unique_ptr<NcclOp> enqueue(const char* what, F&& call);
  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t: the communication stream
  void* ready_ = nullptr;   // cudaEvent_t: the compute stream's point the next operation waits for
  int device_ = 0, rank_ = 0, nranks_ = 1;
  bool aborted_ = false;
};

}  // namespace athanor::cuda
