// cuDNN by dlopen (cudnn_loader.h): the library is resolved once, its symbols kept as pointers.
#include "backend/cuda/cudnn_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <type_traits>
#include <vector>

namespace athanor::cuda {

namespace {

[[maybe_unused]] constexpr const char* kLibrary = "libcudnn.so.9";

#if ATHANOR_HAS_CUDNN_HEADERS
// Opens `library` and fills `api`; "" on success, else the reason. `keep` is the dlopen handle.
std::string load(const char* library, CudnnApi& api, void** keep) {
  dlerror();
  void* h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return std::string("cannot open ") + library + ": " + (e ? e : "unknown dlopen error") +
           " (cuDNN 9 is looked for on LD_LIBRARY_PATH; scripts/gpu_check.sh adds the Python packages' nvidia/*/lib)";
  }
  std::string missing;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (!fn && missing.empty()) missing = name;
  };
  sym(api.GetVersion, "cudnnGetVersion");
  sym(api.GetErrorString, "cudnnGetErrorString");
  sym(api.Create, "cudnnCreate");
  sym(api.SetStream, "cudnnSetStream");
  sym(api.BackendCreateDescriptor, "cudnnBackendCreateDescriptor");
  sym(api.BackendDestroyDescriptor, "cudnnBackendDestroyDescriptor");
  sym(api.BackendSetAttribute, "cudnnBackendSetAttribute");
  sym(api.BackendGetAttribute, "cudnnBackendGetAttribute");
  sym(api.BackendFinalize, "cudnnBackendFinalize");
  sym(api.BackendExecute, "cudnnBackendExecute");
  // Optional (a richer failure reason only).
  api.GetLastErrorString =
      reinterpret_cast<decltype(api.GetLastErrorString)>(dlsym(h, "cudnnGetLastErrorString"));
  if (!missing.empty()) {
    dlclose(h);
    api = CudnnApi{};
    return std::string(library) + " lacks the symbol " + missing;
  }
  const std::size_t v = api.GetVersion();
  if (v / 10000 != 9) {
    dlclose(h);
    api = CudnnApi{};
    return std::string(library) + " reports cuDNN version " + std::to_string(v) + ", not 9.x";
  }
  *keep = h;
  return "";
}

struct Loaded {
  CudnnApi api;
  std::string reason;  // "" when loaded
  void* handle = nullptr;
};

Loaded& loaded() {
  static Loaded l = [] {
    Loaded r;
    r.reason = load(kLibrary, r.api, &r.handle);
    return r;
  }();
  return l;
}
#endif

}  // namespace

#if ATHANOR_HAS_CUDNN_HEADERS
const CudnnApi* cudnn_api() {
  const Loaded& l = loaded();
  return l.reason.empty() ? &l.api : nullptr;
}

cudnnHandle_t cudnn_handle(int device, std::string* why) {
  static std::mutex mu;
  static std::vector<cudnnHandle_t> handles;
  const CudnnApi* api = cudnn_api();
  if (!api) {
    if (why) *why = cudnn_unavailable_reason();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) return nullptr;
  if (handles.size() <= static_cast<std::size_t>(device)) handles.resize(device + 1, nullptr);
  if (!handles[device]) {
    // cudnnCreate binds the handle to the current device: make it `device` for the call.
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != device) cudaSetDevice(device);
    cudnnHandle_t h = nullptr;
    const cudnnStatus_t s = api->Create(&h);
    if (prev != device && prev >= 0) cudaSetDevice(prev);
    if (s != CUDNN_STATUS_SUCCESS) {
      if (why) *why = std::string("cudnnCreate failed: ") + api->GetErrorString(s);
      return nullptr;
    }
    handles[device] = h;
  }
  return handles[device];
}

bool cudnn_available() { return loaded().reason.empty(); }
std::string cudnn_unavailable_reason() { return loaded().reason; }
std::size_t cudnn_version() { return cudnn_available() ? loaded().api.GetVersion() : 0; }

std::string cudnn_probe(const char* library) {
  CudnnApi api;
  void* h = nullptr;
  std::string r = load(library, api, &h);
  if (h) dlclose(h);
  return r;
}
#else
bool cudnn_available() { return false; }
std::string cudnn_unavailable_reason() {
  return "built without cuDNN's headers (cudnn_graph.h was not on the include path)";
}
std::size_t cudnn_version() { return 0; }
std::string cudnn_probe(const char*) { return cudnn_unavailable_reason(); }
#endif

}  // namespace athanor::cuda
