#pragma once
// Multi-process collectives over Open MPI, and over NCCL for CUDA tensors.
//
// Processes are started by an existing launcher (`mpirun -np N prog`); there
// is no home-made transport. init_from_mpi() initialises MPI once per process
// and returns the world group; DeviceMesh (device_mesh.h) splits the world into dp/tp/pp groups.
//
// Invariants:
//  - every collective on a group gets the next sequence number of that group
//    (the same number on every rank, as long as every rank calls the same
//    collectives in the same order, which MPI requires anyway) and an entry in
//    the group's ledger (op, bytes, dtype, group, mesh dimension, call site); when
//    it completes, the entry gets the seconds from posting to completion and goes
//    to the process's communication ledger (comm_ledger.h), as do point-to-point
//    transfers;
//  - blocking calls are the asynchronous ones followed by wait(); waiting polls
//    MPI_Test against a deadline (the group's timeout, default 300 s, or
//    ATHANOR_DIST_TIMEOUT_S). On timeout the rank probes the other ranks of the
//    group over a separate (duplicated) communicator with nonblocking
//    point-to-point messages, with a deadline of its own; a rank that is itself
//    waiting in any collective answers with the last sequence number it posted.
//    Ranks that posted an older sequence number, or did not answer (busy outside
//    any collective, hung or dead), are "not arrived". The rank then prints
//      collective all_reduce #17 on group dp (bytes 4096, f32, called at f.cpp:12)
//      timed out after 5.0s; ranks not arrived: [1]
//    to stderr and calls MPI_Abort, which makes mpirun terminate every rank;
//  - a rank that dies (signal, exit without MPI_Finalize) is noticed by mpirun,
//    which kills the remaining ranks itself with its own message ("mpirun
//    noticed that process rank 1 … exited on signal 9"); ranks that are still
//    waiting would otherwise hit the timeout above, so either way no rank hangs;
//  - tensors may be non-contiguous (staged through a contiguous copy); bf16/f16
//    reductions are done in f32 (converted before, rounded once after); avg on
//    integer tensors is the truncating integer division of the sum;
//  - MPI progress: Open MPI progresses nonblocking collectives inside MPI calls,
//    so an asynchronous collective advances while this rank waits, tests or
//    launches another one (DDP tests its pending buckets whenever it launches).
//
// CUDA tensors (one interface, two backends; DESIGN.md "Distributed"):
//  - a group given an NCCL communicator (init_nccl, a collective over the group: rank 0's
//    ncclGetUniqueId goes out by a broadcast on the group's MPI communicator, then every rank
//    calls ncclCommInitRank) runs the operations on its CUDA tensors through it, on a
//    communication stream that waits (an event) for the work queued on the compute stream so
//    far; bf16/f16 are reduced natively (avg: NCCL's ncclAvg). wait() polls the operation's
//    event against the same deadline and then orders the compute stream after it; the same
//    sequence numbers and ledger entries as MPI's. On timeout the watchdog aborts the
//    communicator (ncclCommAbort) and then probes and aborts as above. Point-to-point
//    transfers over NCCL are matched in posting order (NCCL has no tags). Groups split off a
//    group with a communicator get their own;
//  - otherwise CUDA tensors go through MPI with host staging: the tensor is downloaded (after
//    the work queued on its compute stream, through the device's pinned staging buffers)
//    when the operation is posted, MPI runs on the host copy (asynchronously for the _async
//    forms), and wait() uploads the result, ordered before later work on the compute stream.
//    This is how several processes share one GPU (NCCL refuses two ranks on one GPU);
//  - CPU tensors always go through MPI, on a group with a communicator too (control data:
//    strings, flags, scalars).
//
// Threading: MPI_Init_thread asks for MPI_THREAD_MULTIPLE and accepts whatever
// the library provides (Open MPI 4 built with UCX/ob1 gives MULTIPLE; otherwise
// FUNNELED or SERIALIZED). athanor itself only calls MPI from the thread that
// called init_from_mpi() (the training thread: autograd hooks run on it), so
// FUNNELED is sufficient; thread_level_name() reports what was granted.
#include <chrono>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor::dist {

enum class ReduceOp { sum, avg, max };
const char* reduce_op_name(ReduceOp op);

// dist.backend: automatic = NCCL for CUDA tensors when the build has it and every process on
// this host has a GPU of its own, else MPI with host staging.
enum class Backend { automatic, mpi, nccl };
const char* backend_name(Backend b);  // "auto", "mpi", "nccl"
bool nccl_built();                    // this build has NCCL (ATHANOR_HAS_NCCL)
std::string nccl_version();           // the loaded library's ("2.28.9"), "" without NCCL
// What CUDA tensors on `device` get for `requested`: mpi or nccl, the same on every rank (a
// collective over the world when it has to look at the GPUs: their UUIDs are compared, so a
// per-process CUDA_VISIBLE_DEVICES counts as one GPU each). An Error, before any work, for nccl
// in a build without NCCL, for nccl on CPU tensors, and for nccl where two ranks would share a
// GPU or one has none.
Backend resolve_backend(Backend requested, Device device);

class ProcessGroup;

// Initialises MPI (idempotent) and returns the world group ("world").
std::shared_ptr<ProcessGroup> init_from_mpi(int* argc = nullptr, char*** argv = nullptr);
bool is_initialized();
// MPI_Finalize, once every rank is done (call it before returning from main:
// a process that exits without it is treated by mpirun as failed, and mpirun
// then terminates the whole job). Idempotent; groups still alive become inert.
void finalize();
int rank();         // in MPI_COMM_WORLD
int world_size();
// Rank among the processes on this host: OMPI_COMM_WORLD_LOCAL_RANK when set,
// else the rank in MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
int local_rank();
int local_size();   // processes on this host (OMPI_COMM_WORLD_LOCAL_SIZE, else MPI_COMM_TYPE_SHARED)
const char* thread_level_name();  // "MPI_THREAD_MULTIPLE", …
std::shared_ptr<ProcessGroup> world();

// One ledger entry per operation a rank posted.
struct LedgerEntry {
  uint64_t seq = 0;          // per-group collective sequence number (p2p: per-group p2p number)
  std::string op;            // "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier"
  std::string group;
  std::string dimension;     // the mesh dimension of the group ("dp", "tp", "pp"), else the group's name
  int group_size = 1;
  // The tensor's size: all_reduce/broadcast/send/recv: the tensor; all_gather: the gathered
  // output; reduce_scatter: the input (group size × the output).
  std::size_t bytes = 0;
  // What a ring implementation moves per rank (NCCL's "bus bytes"): all_reduce 2(n-1)/n·bytes,
  // all_gather and reduce_scatter (n-1)/n·bytes, broadcast/send/recv bytes, barrier 0.
  double wire_bytes = 0;
  DType dtype = DType::f32;
  int peer = -1;             // send/recv/broadcast root, else -1
  std::string call_site;     // "file.cpp:123 (function)"
  std::string context;       // what the caller says the operation is for (Work::set_context), in timeout messages
  bool completed = false;
  double seconds = 0;        // from posting to completion as this rank saw it (set on completion)
};

// Handle on an asynchronous operation. wait() blocks (with the group's timeout)
// and then finishes the operation (copies a staged result back, divides for avg).
class Work {
 public:
  struct Impl;
  explicit Work(std::unique_ptr<Impl> impl);
  ~Work();  // an unwaited Work is waited on destruction (an MPI request must not be dropped)
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  void wait();
  bool test();  // nonblocking: true once completed (and finished)
  // What this operation is for, in the caller's words ("stage 1 receiving the activation of
  // micro-batch 3 from stage 0"): a timeout's message names it.
  void set_context(std::string context);
  bool completed() const;
  uint64_t seq() const;
  const std::string& op() const;

 private:
  std::unique_ptr<Impl> impl_;
};
using WorkPtr = std::shared_ptr<Work>;

class ProcessGroup {
 public:
  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;   // within this group
  int size() const;
  const std::string& name() const;
  // The mesh dimension this group spans ("dp", "tp", "pp"; DeviceMesh sets it), else the name.
  const std::string& dimension() const;
  void set_dimension(std::string dim);
  int world_rank_of(int group_rank) const;  // for messages
  // MPI_Comm_split: the ranks that pass the same color form a new group, ordered by key
  // (a collective over this group: every rank calls it).
  std::shared_ptr<ProcessGroup> split(int color, int key, std::string name);
  void set_timeout(std::chrono::milliseconds t);
  std::chrono::milliseconds timeout() const;
  // Gives the group an NCCL communicator on cuda:device (a collective over the group; see the
  // header comment). An Error in a build without NCCL. Idempotent for the same device.
  void init_nccl(int device);
  bool uses_nccl() const;
  // Destroys the communicator (after its queued work); CUDA tensors then go through MPI with
  // host staging. For an owner that ends before the process does: a communicator must go
  // before the CUDA runtime is torn down at exit.
  void release_nccl();
  // How an operation on t goes: "mpi", "mpi (host staging)" or "nccl".
  std::string backend_for(const Tensor& t) const;

  using Loc = std::source_location;
  // ---- asynchronous (MPI_I*); the tensors must stay alive until wait()
  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::sum, Loc loc = Loc::current());
  // in: [size() * n] elements (any shape), out: n elements; out gets this rank's chunk of the reduction.
  WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum, Loc loc = Loc::current());
  // out: size() * in.numel() elements; rank r's input lands at [r * n, (r+1) * n).
  WorkPtr all_gather_async(const Tensor& out, const Tensor& in, Loc loc = Loc::current());
  WorkPtr broadcast_async(const Tensor& t, int root = 0, Loc loc = Loc::current());
  WorkPtr send_async(const Tensor& t, int dst, int tag = 0, Loc loc = Loc::current());
  WorkPtr recv_async(const Tensor& t, int src, int tag = 0, Loc loc = Loc::current());
  WorkPtr barrier_async(Loc loc = Loc::current());

  // ---- blocking
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum, Loc loc = Loc::current()) { all_reduce_async(t, op, loc)->wait(); }
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum, Loc loc = Loc::current()) {
    reduce_scatter_async(out, in, op, loc)->wait();
  }
  void all_gather(const Tensor& out, const Tensor& in, Loc loc = Loc::current()) { all_gather_async(out, in, loc)->wait(); }
  void broadcast(const Tensor& t, int root = 0, Loc loc = Loc::current()) { broadcast_async(t, root, loc)->wait(); }
  void send(const Tensor& t, int dst, int tag = 0, Loc loc = Loc::current()) { send_async(t, dst, tag, loc)->wait(); }
  void recv(const Tensor& t, int src, int tag = 0, Loc loc = Loc::current()) { recv_async(t, src, tag, loc)->wait(); }
  void barrier(Loc loc = Loc::current()) { barrier_async(loc)->wait(); }

  // ---- ledger
  uint64_t last_posted_seq() const;     // 0 before the first collective
  uint64_t last_completed_seq() const;
  std::vector<LedgerEntry> ledger() const;  // the most recent entries (bounded), oldest first

  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Every rank's string (any bytes), in rank order: two collectives on `g` (the lengths,
// then the bytes padded to the longest). For small control data: names, manifests, errors.
std::vector<std::string> all_gather_strings(ProcessGroup& g, const std::string& mine,
                                            std::source_location loc = std::source_location::current());

}  // namespace athanor::dist
