#pragma once
// cuDNN loaded at run time (dlopen "libcudnn.so.9"), never linked: the GPU machine has cuDNN only
// inside its Python packages (scripts/gpu_check.sh puts them on LD_LIBRARY_PATH), and a machine
// without it must run everything else. attention_cudnn.h is the only user.
//
// Invariants:
//  - the library is opened once per process, on first use; its few symbols are reached through
//    the function pointers below. A missing library, a missing symbol, a major version other than
//    9, or a build without cuDNN's headers make cudnn_available() false with a one-line reason
//    (cudnn_unavailable_reason), never an error;
//  - the handle is one per device, created on first use, never destroyed (it lives as long as
//    the process, as the compute streams do).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define ATHANOR_HAS_CUDNN_HEADERS 1
#else
#define ATHANOR_HAS_CUDNN_HEADERS 0
#endif

namespace athanor::cuda {

#if ATHANOR_HAS_CUDNN_HEADERS
// The symbols attention_cudnn.cpp calls, by pointer (types from cuDNN's own declarations).
struct CudnnApi {
  decltype(&::cudnnGetVersion) GetVersion = nullptr;
  decltype(&::cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&::cudnnGetLastErrorString) GetLastErrorString = nullptr;
  decltype(&::cudnnCreate) Create = nullptr;
  decltype(&::cudnnSetStream) SetStream = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) BackendCreateDescriptor = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) BackendDestroyDescriptor = nullptr;
  decltype(&::cudnnBackendSetAttribute) BackendSetAttribute = nullptr;
  decltype(&::cudnnBackendGetAttribute) BackendGetAttribute = nullptr;
  decltype(&::cudnnBackendFinalize) BackendFinalize = nullptr;
  decltype(&::cudnnBackendExecute) BackendExecute = nullptr;
};
// The process's loaded API; nullptr when cuDNN is unavailable.
const CudnnApi* cudnn_api();
// The device's handle (created on first use with `device` current); nullptr with `why` set
// when cudnnCreate fails.
cudnnHandle_t cudnn_handle(int device, std::string* why);
#endif

// Opens libcudnn.so.9 once (thread-safe); true when every symbol resolved and the version is 9.x.
bool cudnn_available();
// "" when available; else one line saying why not (the library's dlerror, the missing symbol,
// the version found, or that the build had no cuDNN headers).
std::string cudnn_unavailable_reason();
// cudnnGetVersion() (e.g. 91900), 0 when unavailable.
std::size_t cudnn_version();

// What loading `library` (a file name for dlopen) would give: "" when it opened, resolved every
// symbol and is cuDNN 9, else the reason. Does not touch the process's loaded copy (tests: the
// unavailable path with a library name that does not exist).
std::string cudnn_probe(const char* library);

}  // namespace athanor::cuda
