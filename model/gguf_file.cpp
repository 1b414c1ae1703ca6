#include "model/gguf_file.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>

namespace strata {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;

bool is_valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::f64); }

bool is_integer_type(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::u16: case GgufValueType::i16:
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::u64: case GgufValueType::i64:
    case GgufValueType::boolean:
      return true;
    default:
      return false;
  }
}

bool is_float_type(GgufValueType t) { return t == GgufValueType::f32 || t == GgufValueType::f64; }

std::string_view value_type_name(GgufValueType t) {
  static constexpr std::string_view names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                               "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "invalid";
}

// Smallest encoding of one value of the type: bounds counts before anything is allocated for them.
uint64_t min_value_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::boolean: return 1;
    case GgufValueType::u16: case GgufValueType::i16: return 2;
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::f32: return 4;
    case GgufValueType::string: return 8;   // the length alone
    case GgufValueType::array: return 12;   // element type + count
    default: return 8;                      // u64, i64, f64
  }
}

}  // namespace

// Reads the header, the metadata and the tensor infos, checking every read against the file size.
class GgufParser {
 public:
  GgufParser(GgufFile& file, const uint8_t* data, uint64_t size) : file_(file), data_(data), size_(size) {}

  void parse() {
    parse_header();
    for (uint64_t i = 0; i < kv_count_; ++i) parse_kv();
    file_.alignment_ = alignment_;
    for (uint64_t i = 0; i < tensor_count_; ++i) parse_tensor_info();
    file_.data_offset_ = align_up(pos_, alignment_);
    for (size_t i = 0; i < file_.tensors_.size(); ++i) place_tensor(file_.tensors_[i], tensor_info_pos_[i]);
  }

 private:
  [[noreturn]] void fail(uint64_t at, const std::string& message) const {
    throw GgufError(file_.path_ + ": offset " + std::to_string(at) + ": " + message);
  }

  void need(uint64_t n, std::string_view what) const {
    if (n > size_ - pos_) {
      fail(pos_, "expected " + std::string(what) + ", file ends at " + std::to_string(size_));
    }
  }

  uint64_t remaining() const { return size_ - pos_; }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const uint64_t len = read<uint64_t>("a u64 length of " + std::string(what));
    if (len > remaining()) {
      fail(pos_, "expected " + std::to_string(len) + " bytes of " + std::string(what) + ", file ends at " +
                     std::to_string(size_));
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

  static uint64_t align_up(uint64_t x, uint64_t a) { return x + (a - x % a) % a; }

  void parse_header() {
    need(4, "the magic \"GGUF\"");
    if (std::memcmp(data_, "GGUF", 4) != 0) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "%02x %02x %02x %02x", data_[0], data_[1], data_[2], data_[3]);
      fail(0, std::string("expected the magic \"GGUF\" (47 47 55 46), found ") + hex);
    }
    pos_ = 4;
    const uint64_t version_pos = pos_;
    const uint32_t version = read<uint32_t>("a u32 version");
    if (version != 0 && (version & 0xFFFF) == 0) {
      fail(version_pos, "version reads as " + std::to_string(version) +
                            ": the file is big-endian, only little-endian GGUF is supported");
    }
    if (version == 1) fail(version_pos, "GGUF version 1 (32-bit counts) is not supported; expected 2 or 3");
    if (version != 2 && version != 3) {
      fail(version_pos, "unsupported GGUF version " + std::to_string(version) + "; expected 2 or 3");
    }
    file_.version_ = version;
    // Huge counts need no check here: nothing is allocated for them up front, and reading stops at the end.
    tensor_count_ = read<uint64_t>("a u64 tensor count");
    kv_count_ = read<uint64_t>("a u64 metadata key/value count");
  }

  GgufValueType read_value_type(std::string_view what, const std::string& key) {
    const uint64_t at = pos_;
    const uint32_t t = read<uint32_t>(what);
    if (!is_valid_value_type(t)) {
      fail(at, "unknown metadata value type " + std::to_string(t) + " for key '" + key + "'; expected 0..12");
    }
    return static_cast<GgufValueType>(t);
  }

  // One scalar of type t into the integer or float slot of v.
  void read_scalar(GgufValueType t, GgufValue& v, const std::string& key) {
    switch (t) {
      case GgufValueType::u8: v.int_value = read<uint8_t>("a u8 value"); break;
      case GgufValueType::i8: v.int_value = read<int8_t>("an i8 value"); break;
      case GgufValueType::u16: v.int_value = read<uint16_t>("a u16 value"); break;
      case GgufValueType::i16: v.int_value = read<int16_t>("an i16 value"); break;
      case GgufValueType::u32: v.int_value = read<uint32_t>("a u32 value"); break;
      case GgufValueType::i32: v.int_value = read<int32_t>("an i32 value"); break;
      case GgufValueType::i64: v.int_value = read<int64_t>("an i64 value"); break;
      case GgufValueType::u64: {
        v.uint_value = read<uint64_t>("a u64 value");
        v.int_value = static_cast<int64_t>(v.uint_value);
        return;
      }
      case GgufValueType::boolean: {
        const uint64_t at = pos_;
        const uint8_t b = read<uint8_t>("a bool value");
        if (b > 1) fail(at, "expected a bool (0 or 1) for key '" + key + "', found " + std::to_string(b));
        v.int_value = b;
        break;
      }
      case GgufValueType::f32: v.float_value = read<float>("an f32 value"); return;
      case GgufValueType::f64: v.float_value = read<double>("an f64 value"); return;
      default: fail(pos_, "internal: not a scalar type");
    }
    v.uint_value = static_cast<uint64_t>(v.int_value);
  }

  void read_array(GgufValue& v, const std::string& key) {
    const uint64_t type_pos = pos_;
    const GgufValueType elem = read_value_type("a u32 array element type", key);
    if (elem == GgufValueType::array) {
      fail(type_pos, "nested arrays are not supported (key '" + key + "'); expected a scalar or string element type");
    }
    const uint64_t count_pos = pos_;
    const uint64_t count = read<uint64_t>("a u64 array element count");
    if (count > remaining() / min_value_bytes(elem)) {
      fail(count_pos, "array of " + std::to_string(count) + " " + std::string(value_type_name(elem)) +
                          " elements (key '" + key + "') cannot fit: expected that many elements of at least " +
                          std::to_string(min_value_bytes(elem)) + " bytes, file ends at " + std::to_string(size_));
    }
    v.element_type = elem;
    v.array_count = count;
    if (elem == GgufValueType::string) {
      v.string_array.reserve(count);
      for (uint64_t i = 0; i < count; ++i) v.string_array.push_back(read_string("a string array element"));
    } else if (is_float_type(elem)) {
      v.float_array.reserve(count);
      GgufValue scalar;
      for (uint64_t i = 0; i < count; ++i) {
        read_scalar(elem, scalar, key);
        v.float_array.push_back(scalar.float_value);
      }
    } else {
      v.int_array.reserve(count);
      GgufValue scalar;
      for (uint64_t i = 0; i < count; ++i) {
        read_scalar(elem, scalar, key);
        v.int_array.push_back(scalar.int_value);
      }
    }
  }

  void parse_kv() {
    const uint64_t key_pos = pos_;
    std::string key = read_string("a metadata key");
    if (file_.metadata_.count(key) != 0) fail(key_pos, "duplicate metadata key '" + key + "'");
    GgufValue v;
    v.type = read_value_type("a u32 value type", key);
    const uint64_t value_pos = pos_;
    if (v.type == GgufValueType::string) {
      v.string_value = read_string("a string value");
    } else if (v.type == GgufValueType::array) {
      read_array(v, key);
    } else {
      read_scalar(v.type, v, key);
    }
    if (key == "general.alignment") {
      if (v.type != GgufValueType::u32) {
        fail(value_pos, "general.alignment must be a u32, found " + std::string(value_type_name(v.type)));
      }
      if (v.int_value == 0 || (v.int_value & (v.int_value - 1)) != 0) {
        fail(value_pos, "general.alignment must be a power of two, found " + std::to_string(v.int_value));
      }
      alignment_ = static_cast<uint64_t>(v.int_value);
    }
    file_.metadata_.emplace(std::move(key), std::move(v));
  }

  void parse_tensor_info() {
    tensor_info_pos_.push_back(pos_);
    const uint64_t name_pos = pos_;
    GgufTensorInfo t;
    t.name = read_string("a tensor name");
    if (file_.tensor_index_.count(t.name) != 0) fail(name_pos, "duplicate tensor name '" + t.name + "'");
    const uint64_t dims_pos = pos_;
    const uint32_t n_dims = read<uint32_t>("a u32 dimension count");
    if (n_dims > kMaxDims) {
      fail(dims_pos, "tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions; expected at most 4");
    }
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne_pos = pos_;
      const uint64_t ne = read<uint64_t>("a u64 dimension size");
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(n_elements, static_cast<int64_t>(ne), &n_elements)) {
        fail(ne_pos, "tensor '" + t.name + "': dimension " + std::to_string(ne) + " overflows the element count");
      }
      t.shape.push_back(static_cast<int64_t>(ne));
    }
    const uint64_t type_pos = pos_;
    const uint32_t type_id = read<uint32_t>("a u32 ggml type");
    const GgmlTypeTraits* traits = ggml_type_traits(type_id);
    if (traits == nullptr) {
      fail(type_pos, "tensor '" + t.name + "' has unknown ggml type id " + std::to_string(type_id));
    }
    t.type = static_cast<GgmlType>(type_id);
    const int64_t row_length = t.shape.empty() ? 1 : t.shape[0];  // a 0-d tensor holds one value
    if (row_length % traits->block_elements != 0) {
      fail(type_pos, "tensor '" + t.name + "': row length " + std::to_string(row_length) +
                         " is not a multiple of the " + std::string(traits->name) + " block size " +
                         std::to_string(traits->block_elements));
    }
    const uint64_t offset_pos = pos_;
    t.offset = read<uint64_t>("a u64 tensor data offset");
    if (t.offset % alignment_ != 0) {
      fail(offset_pos, "tensor '" + t.name + "': data offset " + std::to_string(t.offset) +
                           " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    const uint64_t n_blocks = static_cast<uint64_t>(n_elements / traits->block_elements);
    if (__builtin_mul_overflow(n_blocks, static_cast<uint64_t>(traits->block_bytes), &t.n_bytes)) {
      fail(dims_pos, "tensor '" + t.name + "': byte size overflows");
    }
    file_.tensor_index_.emplace(t.name, file_.tensors_.size());
    file_.tensors_.push_back(std::move(t));
  }

  // Turns the relative offset into an absolute one once data_start is known, and checks the data is in the file.
  void place_tensor(GgufTensorInfo& t, uint64_t info_pos) const {
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(file_.data_offset_, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.n_bytes, &end) || end > size_) {
      fail(info_pos, "tensor '" + t.name + "': expected its " + std::to_string(t.n_bytes) +
                         " bytes of data at data start " + std::to_string(file_.data_offset_) + " + offset " +
                         std::to_string(t.offset) + ", file ends at " + std::to_string(size_));
    }
    t.offset = begin;
    t.data = data_ + begin;
  }

  GgufFile& file_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  std::vector<uint64_t> tensor_info_pos_;
};

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  auto file = std::make_shared<GgufFile>();
  file->path_ = path;
  file->file_ = MappedFile::open(path);
  GgufParser(*file, file->file_->data(), file->file_->size()).parse();
  return file;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const GgufValue& v,
                             std::string_view expected) {
  std::string found(value_type_name(v.type));
  if (v.type == GgufValueType::array) found += " of " + std::string(value_type_name(v.element_type));
  throw GgufError(path + ": metadata key '" + std::string(key) + "' has type " + found + ", expected " +
                  std::string(expected));
}

}  // namespace

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!is_integer_type(v->type)) wrong_type(path_, key, *v, "an integer");
  if (v->type == GgufValueType::u64 && v->uint_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw GgufError(path_ + ": metadata key '" + std::string(key) + "': u64 value " +
                    std::to_string(v->uint_value) + " does not fit in an i64");
  }
  return v->int_value;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (is_float_type(v->type)) return v->float_value;
  if (is_integer_type(v->type) && v->type != GgufValueType::boolean) {
    return v->type == GgufValueType::u64 ? static_cast<double>(v->uint_value) : static_cast<double>(v->int_value);
  }
  wrong_type(path_, key, *v, "a number");
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!is_integer_type(v->type)) wrong_type(path_, key, *v, "a bool");
  return v->int_value != 0;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::string) wrong_type(path_, key, *v, "a string");
  return v->string_value;
}

std::optional<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::array || v->element_type != GgufValueType::string) {
    wrong_type(path_, key, *v, "an array of string");
  }
  return v->string_array;
}

std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::array || !is_integer_type(v->element_type)) {
    wrong_type(path_, key, *v, "an array of integers");
  }
  return v->int_array;
}

std::optional<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::array) wrong_type(path_, key, *v, "an array of numbers");
  if (is_float_type(v->element_type)) return v->float_array;
  if (is_integer_type(v->element_type) && v->element_type != GgufValueType::boolean) {
    std::vector<double> out;
    out.reserve(v->int_array.size());
    for (int64_t x : v->int_array) {
      out.push_back(v->element_type == GgufValueType::u64 ? static_cast<double>(static_cast<uint64_t>(x))
                                                          : static_cast<double>(x));
    }
    return out;
  }
  wrong_type(path_, key, *v, "an array of numbers");
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (t == nullptr) throw GgufError(path_ + ": no tensor named '" + std::string(name) + "'");
  return *t;
}

}  // namespace strata
