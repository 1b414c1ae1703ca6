#pragma once
// One CUDA backend's device, stream and cuBLAS handle, and the short-lived memory of one Backend op: the block
// tables and index arrays the op uploads from the host, and its device scratch.
//
// Every op of a backend runs on stream(). An op starts with begin_op(); what upload() and scratch() return stays
// valid until the next begin_op(). Nothing on this path synchronises the device:
//
// * Device memory (uploads and scratch) is bump-allocated from an arena, 256-byte aligned, and the arena is
//   rewound by begin_op(). Rewinding needs no fence: the next op's copies and kernels are queued on the same
//   stream, so they run after the kernels of the previous op that read the old contents. When an op needs more
//   than the arena holds, a further chunk is allocated for the rest of the op (the op's earlier pointers stay
//   valid); the next begin_op() hands every chunk to cudaFreeAsync on stream() (stream-ordered: the memory is
//   released only after the kernels already queued have finished with it) and allocates one chunk of their total
//   size, so the steady state is one chunk and no allocation.
// * Host staging for uploads is pinned, so that cudaMemcpyAsync really is asynchronous. The host writes the
//   staging memory at once while the copy out of it runs later, so staging cannot be rewound like the arena:
//   ops use kFrames staging frames in turn, and each frame carries an event recorded after the last copy out of
//   it. begin_op() waits on the event of the frame it is about to reuse, which the GPU passed kFrames - 1 ops
//   ago. kFrames bounds how far the host may run ahead of the GPU: a decode step's layer is about 20 ops, some
//   a few microseconds of GPU time and shorter than their launch, others (the large matrix products) much
//   longer, so the host must be able to queue several layers while a long product runs, or the GPU idles
//   during the short ops that follow (on an H200, 128 frames instead of 4, with each op's uploads in one copy,
//   made Llama-3-8B's decode 3 to 8% faster). A frame that overflows takes a further chunk, and its ops use its
//   chunks in turn from then on. Chunks are freed only with the context: cudaFreeHost waits for the whole device,
//   and merging a frame's chunks as the arena does put such waits into the first steps of a larger batch. Frames
//   take pinned memory only once an op uploads through them.
//
// A context belongs to one backend and is used from one thread at a time.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

namespace strata::cuda {

// Throws std::runtime_error("cuda: <what>: <error string>") unless e is cudaSuccess.
void check(cudaError_t e, const char* what);
// Throws std::runtime_error("cuda: <what>: cublas status <name>") unless s is CUBLAS_STATUS_SUCCESS.
void check(cublasStatus_t s, const char* what);

class CudaContext {
 public:
  // overlap_launches: the decode kernels are launched overlapped (kernels/cuda/overlapped_launch.cuh) where the
  // device has programmatic dependent launch (compute capability 9.0 and later).
  CudaContext(int device, bool overlap_launches);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  // Streaming multiprocessors of the device: kernels size their grids to fill them.
  int multiprocessors() const { return multiprocessors_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  bool overlaps_launches() const { return overlap_launches_; }

  // Starts one Backend op: the previous op's uploads and scratch may be reused from here on.
  void begin_op();
  // A device copy of `host`, queued on stream(); valid until the next begin_op(). Never null.
  const int32_t* upload(std::span<const int32_t> host);
  const int64_t* upload(std::span<const int64_t> host);
  const float* upload(std::span<const float> host);
  // Several host arrays in one copy (a copy costs the host a few microseconds, more than a small kernel's launch):
  // their device addresses in the order given, each 16-byte aligned; as upload().
  struct HostBytes {
    const void* data;
    size_t bytes;
  };
  template <class T>
  static HostBytes bytes_of(std::span<const T> v) { return {v.data(), v.size_bytes()}; }
  template <class T>
  static HostBytes bytes_of(const std::vector<T>& v) { return {v.data(), v.size() * sizeof(T)}; }
  std::vector<const void*> upload_together(std::initializer_list<HostBytes> arrays);
  // Uninitialised device memory, 256-byte aligned, valid until the next begin_op(). Never null.
  void* scratch(size_t bytes);
  // Waits for the work queued on stream(), then copies `bytes` from device memory to host memory.
  void download(const void* device, void* host, size_t bytes);
  // A device copy of an array of plain structs, which travels as its words (int32_t or int64_t, the widest that
  // the struct's size and alignment allow); as upload().
  template <class Word, class T>
  const T* upload_structs(const std::vector<T>& v) {
    static_assert(sizeof(T) % sizeof(Word) == 0 && alignof(T) >= alignof(Word));
    const auto* words = reinterpret_cast<const Word*>(v.data());
    return reinterpret_cast<const T*>(upload(std::span<const Word>(words, v.size() * sizeof(T) / sizeof(Word))));
  }

 private:
  // A bump allocator over a list of chunks; chunks.back() is the one being filled.
  struct Chunk {
    char* data = nullptr;
    size_t size = 0;
  };
  struct Frame {
    std::vector<Chunk> chunks;
    size_t current = 0;            // the chunk the op allocates from
    size_t used = 0;               // bytes used in chunks[current]
    cudaEvent_t done = nullptr;    // recorded after the last copy out of this frame
    bool pending = false;          // `done` was recorded and may not have passed yet
  };
  static constexpr int kFrames = 128;
  static constexpr size_t kAlign = 256;
  static constexpr size_t kFirstChunk = size_t(1) << 20;         // of the device arena
  static constexpr size_t kFirstStagingChunk = size_t(1) << 16;  // of a staging frame: uploads are small

  const void* upload_bytes(const void* host, size_t bytes);
  // Bump-allocates from the device arena / from the current staging frame.
  char* arena_alloc(size_t bytes);
  char* staging_alloc(size_t bytes);

  int device_ = 0;
  int multiprocessors_ = 0;
  bool overlap_launches_ = false;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::vector<Chunk> arena_;
  size_t arena_used_ = 0;
  std::array<Frame, kFrames> frames_;
  int frame_ = 0;                     // the staging frame of the current op
  size_t staging_largest_chunk_ = 0;  // of any frame
};

}  // namespace strata::cuda
