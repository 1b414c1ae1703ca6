#pragma once
// A view of a 2-D row-major tensor in a backend's memory. Backends own the memory; a Tensor never does.
#include <cstdint>
#include <stdexcept>

namespace strata {

// `packed`: a weight matrix in a backend's own layout (Backend::upload_weight, e.g. the CPU backend's quantized
// blocks, kernels/cpu/packed_weight.h); `data` points at the backend's description of it and rows/cols are the
// matrix's shape. Only the backend that made it reads it.
enum class DType : uint8_t { f32, bf16, f16, i32, i8, packed };

inline int dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::i8: return 1;
    case DType::packed: return 0;  // not an array of elements
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i8: return "i8";
    case DType::packed: return "packed";
  }
  return "?";
}

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t size() const { return rows * cols; }
  int64_t bytes() const { return size() * dtype_bytes(dtype); }
  float* f32() const {
    if (dtype != DType::f32) throw std::logic_error("tensor is not f32");
    return static_cast<float*>(data);
  }
  float* row(int64_t r) const { return f32() + r * cols; }
  // Rows [begin, begin + n) as a tensor of their own.
  Tensor slice_rows(int64_t begin, int64_t n) const {
    return Tensor{static_cast<char*>(data) + begin * cols * dtype_bytes(dtype), dtype, n, cols};
  }
};

}  // namespace strata
