#include "kernels/cuda/cuda_context.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace strata::cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuda: ") + what + ": cublas status " + cublasGetStatusName(s));
  }
}

namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

CudaContext::CudaContext(int device, bool overlap_launches) : device_(device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute (multiprocessors)");
  int major = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
        "cudaDeviceGetAttribute (compute capability)");
  overlap_launches_ = overlap_launches && major >= 9;
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cublasCreate(&cublas_), "cublasCreate");
  check(cublasSetStream(cublas_, stream_), "cublasSetStream");
  for (Frame& f : frames_) check(cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming), "cudaEventCreate");
}

CudaContext::~CudaContext() {
  // Errors are ignored here: a destructor must not throw, and the process is releasing the device anyway.
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  for (Chunk& c : arena_) cudaFree(c.data);
  for (Frame& f : frames_) {
    for (Chunk& c : f.chunks) cudaFreeHost(c.data);
    cudaEventDestroy(f.done);
  }
  cublasDestroy(cublas_);
  cudaStreamDestroy(stream_);
}

void CudaContext::begin_op() {
  // The calling thread may not be the one that created the context; the current device is per thread.
  check(cudaSetDevice(device_), "cudaSetDevice");

  // Device arena: merge the chunks of an op that overflowed into one (stream-ordered free and alloc, see the
  // header), then rewind.
  if (arena_.size() > 1) {
    size_t total = 0;
    for (Chunk& c : arena_) {
      total += c.size;
      check(cudaFreeAsync(c.data, stream_), "cudaFreeAsync (arena)");
    }
    arena_.clear();
    Chunk merged{nullptr, total};
    check(cudaMallocAsync(reinterpret_cast<void**>(&merged.data), total, stream_), "cudaMallocAsync (arena)");
    arena_.push_back(merged);
  }
  arena_used_ = 0;

  // Host staging: take the next frame once the copies out of it (kFrames - 1 ops ago) have run.
  frame_ = (frame_ + 1) % kFrames;
  Frame& f = frames_[frame_];
  if (f.pending) {
    check(cudaEventSynchronize(f.done), "cudaEventSynchronize (staging frame)");
    f.pending = false;
  }
  f.current = 0;
  f.used = 0;
}

char* CudaContext::arena_alloc(size_t bytes) {
  const size_t need = align_up(bytes == 0 ? 1 : bytes, kAlign);
  if (arena_.empty() || arena_used_ + need > arena_.back().size) {
    // A new chunk for the rest of this op: at least twice the last one, so that overflows stay rare.
    const size_t size = std::max(need, arena_.empty() ? kFirstChunk : 2 * arena_.back().size);
    Chunk c{nullptr, size};
    check(cudaMallocAsync(reinterpret_cast<void**>(&c.data), size, stream_), "cudaMallocAsync (arena)");
    arena_.push_back(c);
    arena_used_ = 0;
  }
  char* p = arena_.back().data + arena_used_;
  arena_used_ += need;
  return p;
}

char* CudaContext::staging_alloc(size_t bytes) {
  Frame& f = frames_[frame_];
  const size_t need = align_up(bytes == 0 ? 1 : bytes, kAlign);
  while (f.current < f.chunks.size() && f.used + need > f.chunks[f.current].size) {
    ++f.current;  // too full for this allocation: the op goes on in the next chunk
    f.used = 0;
  }
  if (f.current == f.chunks.size()) {
    // Kept until the context goes: cudaFreeHost would wait for the whole device. A new chunk is at least as large
    // as any other frame's largest, since the ops that outgrew that one come round to this frame too.
    const size_t size = std::max({need, f.chunks.empty() ? kFirstStagingChunk : 2 * f.chunks.back().size,
                                  staging_largest_chunk_});
    Chunk c{nullptr, size};
    check(cudaMallocHost(reinterpret_cast<void**>(&c.data), size), "cudaMallocHost (staging)");
    f.chunks.push_back(c);
    f.used = 0;
    staging_largest_chunk_ = std::max(staging_largest_chunk_, size);
  }
  char* p = f.chunks[f.current].data + f.used;
  f.used += need;
  return p;
}

const void* CudaContext::upload_bytes(const void* host, size_t bytes) { return upload_together({{host, bytes}})[0]; }

std::vector<const void*> CudaContext::upload_together(std::initializer_list<HostBytes> arrays) {
  constexpr size_t kArrayAlign = 16;
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const HostBytes& a : arrays) {
    offsets.push_back(total);
    total = align_up(total + a.bytes, kArrayAlign);
  }
  char* device = arena_alloc(total);
  std::vector<const void*> addresses;
  for (size_t offset : offsets) addresses.push_back(device + offset);
  if (total == 0) return addresses;
  char* staged = staging_alloc(total);
  size_t i = 0;
  for (const HostBytes& a : arrays) {
    if (a.bytes > 0) std::memcpy(staged + offsets[i], a.data, a.bytes);
    ++i;
  }
  check(cudaMemcpyAsync(device, staged, total, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
  Frame& f = frames_[frame_];
  check(cudaEventRecord(f.done, stream_), "cudaEventRecord (staging frame)");
  f.pending = true;
  return addresses;
}

const int32_t* CudaContext::upload(std::span<const int32_t> host) {
  return static_cast<const int32_t*>(upload_bytes(host.data(), host.size_bytes()));
}

const int64_t* CudaContext::upload(std::span<const int64_t> host) {
  return static_cast<const int64_t*>(upload_bytes(host.data(), host.size_bytes()));
}

const float* CudaContext::upload(std::span<const float> host) {
  return static_cast<const float*>(upload_bytes(host.data(), host.size_bytes()));
}

void* CudaContext::scratch(size_t bytes) { return arena_alloc(bytes); }

void CudaContext::download(const void* device, void* host, size_t bytes) {
  if (bytes == 0) return;
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (download)");
  check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (download)");
}

}  // namespace strata::cuda
