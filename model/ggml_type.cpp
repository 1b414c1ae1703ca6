#include "model/ggml_type.h"

#include <array>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

namespace strata {

namespace {

constexpr int64_t kQK = 256;  // QK_K: super-block size of the k-quants

// Every id of ../shared/specs/model_format.md section 2 that has a known block layout; the unsupported ones are
// listed too so that errors can name them and parsers can bounds-check their data. Removed ids stay empty.
constexpr std::array<std::optional<GgmlTypeTraits>, 42> kTraits = [] {
  std::array<std::optional<GgmlTypeTraits>, 42> t{};
  t[0] = GgmlTypeTraits{"f32", 1, 4, true};
  t[1] = GgmlTypeTraits{"f16", 1, 2, true};
  t[2] = GgmlTypeTraits{"q4_0", 32, 18, true};
  t[3] = GgmlTypeTraits{"q4_1", 32, 20, true};
  t[6] = GgmlTypeTraits{"q5_0", 32, 22, true};
  t[7] = GgmlTypeTraits{"q5_1", 32, 24, true};
  t[8] = GgmlTypeTraits{"q8_0", 32, 34, true};
  t[9] = GgmlTypeTraits{"q8_1", 32, 36, false};
  t[10] = GgmlTypeTraits{"q2_k", kQK, 84, false};
  t[11] = GgmlTypeTraits{"q3_k", kQK, 110, false};
  t[12] = GgmlTypeTraits{"q4_k", kQK, 144, true};
  t[13] = GgmlTypeTraits{"q5_k", kQK, 176, true};
  t[14] = GgmlTypeTraits{"q6_k", kQK, 210, true};
  t[15] = GgmlTypeTraits{"q8_k", kQK, 292, false};
  t[16] = GgmlTypeTraits{"iq2_xxs", kQK, 66, false};
  t[17] = GgmlTypeTraits{"iq2_xs", kQK, 74, false};
  t[18] = GgmlTypeTraits{"iq3_xxs", kQK, 98, false};
  t[19] = GgmlTypeTraits{"iq1_s", kQK, 50, false};
  t[20] = GgmlTypeTraits{"iq4_nl", 32, 18, false};
  t[21] = GgmlTypeTraits{"iq3_s", kQK, 110, false};
  t[22] = GgmlTypeTraits{"iq2_s", kQK, 82, false};
  t[23] = GgmlTypeTraits{"iq4_xs", kQK, 136, false};
  t[24] = GgmlTypeTraits{"i8", 1, 1, false};
  t[25] = GgmlTypeTraits{"i16", 1, 2, false};
  t[26] = GgmlTypeTraits{"i32", 1, 4, false};
  t[27] = GgmlTypeTraits{"i64", 1, 8, false};
  t[28] = GgmlTypeTraits{"f64", 1, 8, false};
  t[29] = GgmlTypeTraits{"iq1_m", kQK, 56, false};
  t[30] = GgmlTypeTraits{"bf16", 1, 2, true};
  t[34] = GgmlTypeTraits{"tq1_0", kQK, 54, false};
  t[35] = GgmlTypeTraits{"tq2_0", kQK, 66, false};
  t[39] = GgmlTypeTraits{"mxfp4", 32, 17, false};
  t[40] = GgmlTypeTraits{"nvfp4", 64, 36, false};
  t[41] = GgmlTypeTraits{"q1_0", 128, 18, false};
  return t;
}();

const GgmlTypeTraits& traits_or_throw(GgmlType type) {
  const GgmlTypeTraits* t = ggml_type_traits(static_cast<uint32_t>(type));
  if (t == nullptr) {
    throw std::invalid_argument("unknown ggml type id " + std::to_string(static_cast<uint32_t>(type)));
  }
  return *t;
}

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Block structs are packed byte arrays in the file; reading fields byte-wise keeps this independent of the
// host's alignment rules (the data of a row may start at any offset). The formats the kernels compute with
// (kernels/weight_format.h) are dequantized there; the others here.

// The 32 codes of a Q5_0 block in element order, as q - 16 (its qh at byte 2, after d; its qs at byte 6).
void q5_0_codes(const uint8_t* b, int8_t* codes) {
  uint8_t q[32];
  five_bit_values(b + 2, b + 6, q);
  for (int j = 0; j < 32; ++j) codes[j] = static_cast<int8_t>(q[j] - 16);
}

void dequantize_q5_0(const uint8_t* b, float* y, int64_t n_blocks) {
  int8_t codes[32];
  for (int64_t i = 0; i < n_blocks; ++i, b += 22, y += 32) {
    const float d = fp16_to_fp32(load_u16(b));
    q5_0_codes(b, codes);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(codes[j]) * d;
  }
}

}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t type_id) {
  if (type_id >= kTraits.size() || !kTraits[type_id]) return nullptr;
  return &*kTraits[type_id];
}

std::optional<WeightFormat> weight_format_of(GgmlType type) {
  switch (type) {
    case GgmlType::f32: return WeightFormat::f32;
    case GgmlType::q8_0: return WeightFormat::q8_0;
    case GgmlType::q4_0: return WeightFormat::q4_0;
    case GgmlType::q4_1: return WeightFormat::q4_1;
    case GgmlType::q4_k: return WeightFormat::q4_k;
    case GgmlType::q5_k: return WeightFormat::q5_k;
    case GgmlType::q6_k: return WeightFormat::q6_k;
    case GgmlType::q5_1: return WeightFormat::q5_1;
    case GgmlType::f16: return WeightFormat::f16;
    case GgmlType::bf16: return WeightFormat::bf16;
    default: return std::nullopt;
  }
}

std::string_view ggml_type_name(GgmlType type) {
  const GgmlTypeTraits* t = ggml_type_traits(static_cast<uint32_t>(type));
  return t ? t->name : std::string_view("unknown");
}

uint64_t ggml_row_bytes(GgmlType type, int64_t n_elements) {
  const GgmlTypeTraits& t = traits_or_throw(type);
  if (n_elements < 0 || n_elements % t.block_elements != 0) {
    throw std::invalid_argument(std::to_string(n_elements) + " elements is not a multiple of the " +
                                std::string(t.name) + " block size " + std::to_string(t.block_elements));
  }
  return static_cast<uint64_t>(n_elements / t.block_elements) * static_cast<uint64_t>(t.block_bytes);
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n_elements) {
  const GgmlTypeTraits& t = traits_or_throw(type);
  if (!t.supported) {
    throw std::invalid_argument("cannot dequantize ggml type " + std::string(t.name) + " (id " +
                                std::to_string(static_cast<uint32_t>(type)) + "): not supported");
  }
  ggml_row_bytes(type, n_elements);  // validates the block multiple
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t n_blocks = n_elements / t.block_elements;
  switch (type) {
    case GgmlType::f32: std::memcpy(dst, src, static_cast<size_t>(n_elements) * sizeof(float)); break;
    case GgmlType::f16: dequantize_weight_row(WeightFormat::f16, src, dst, n_elements); break;
    case GgmlType::bf16: dequantize_weight_row(WeightFormat::bf16, src, dst, n_elements); break;
    case GgmlType::q4_0: dequantize_weight_row(WeightFormat::q4_0, src, dst, n_elements); break;
    case GgmlType::q4_1: dequantize_weight_row(WeightFormat::q4_1, src, dst, n_elements); break;
    case GgmlType::q8_0: dequantize_weight_row(WeightFormat::q8_0, src, dst, n_elements); break;
    case GgmlType::q4_k: dequantize_weight_row(WeightFormat::q4_k, src, dst, n_elements); break;
    case GgmlType::q5_k: dequantize_weight_row(WeightFormat::q5_k, src, dst, n_elements); break;
    case GgmlType::q6_k: dequantize_weight_row(WeightFormat::q6_k, src, dst, n_elements); break;
    case GgmlType::q5_0: dequantize_q5_0(b, dst, n_blocks); break;
    case GgmlType::q5_1: dequantize_weight_row(WeightFormat::q5_1, src, dst, n_elements); break;
    default:
      throw std::invalid_argument("cannot dequantize ggml type " + std::string(t.name));
  }
}

void q5_0_as_q8_0(const uint8_t* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, src += 22, dst += 34) {
    dst[0] = src[0];  // d, fp16, as it is
    dst[1] = src[1];
    q5_0_codes(src, reinterpret_cast<int8_t*>(dst + 2));
  }
}

}  // namespace strata
