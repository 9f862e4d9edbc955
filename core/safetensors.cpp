// core/safetensors.cpp: safetensors reader and writer with per-tensor CRC32.
#include "core/safetensors.h"

#include "core/half.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace dpt {
namespace {

using json = nlohmann::json;

// Headers larger than this are malformed, not big: ours are a few KB.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
// The metadata that says whose tensors these are: PyTorch's, as safetensors.torch.save_file writes it.
constexpr const char* kFormat = "pt";

const char* st_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::BF16: return "BF16";
  }
  return "?";
}

std::optional<DType> parse_st_dtype(const std::string& s) {
  for (DType t : {DType::F32, DType::F64, DType::I32, DType::I64, DType::U8, DType::BF16})
    if (s == st_dtype(t)) return t;
  return std::nullopt;
}

// Dtypes read into a wider one, as PyTorch's files read them (trainer/torch_file.cpp): F16 (Hugging Face's fp16
// weights) as float32, exactly; I16 and I8 as int32; BOOL as uint8 0 or 1 (GPT-2's causal-mask buffers).
struct Widened {
  const char* name;
  uint64_t bytes;  // an element's in the file
  DType to;
};
constexpr Widened kWidened[] = {
    {"F16", 2, DType::F32}, {"I16", 2, DType::I32}, {"I8", 1, DType::I32}, {"BOOL", 1, DType::U8}};

const Widened* widened(const std::string& dtype) {
  for (const Widened& w : kWidened)
    if (dtype == w.name) return &w;
  return nullptr;
}

// `t`'s elements from the file's `in`, each `w.bytes` wide.
void widen(const Widened& w, const char* in, Tensor& t) {
  const std::string_view name = w.name;
  const size_t n = t.numel();
  if (name == "F16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      t.data<float>()[i] = half_to_float(h);
    }
  } else if (name == "I16") {
    for (size_t i = 0; i < n; ++i) {
      int16_t v;
      std::memcpy(&v, in + 2 * i, 2);
      t.data<int32_t>()[i] = v;
    }
  } else if (name == "I8") {
    for (size_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int8_t>(in[i]);
  } else {  // BOOL
    for (size_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = in[i] != 0;
  }
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) DPT_THROW(CheckpointError, "writing {}: {}", path, std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// A tensor's byte range in the data, as the header gives it.
struct Entry {
  uint64_t begin, end;
  NamedTensor nt;
};

// Sorts `entries` into file order and checks that their bytes tile the data, throwing CheckpointError otherwise.
void check_tiling(std::vector<Entry>& entries, uint64_t data_size, const std::string& path) {
  // In file order: by offset, an empty tensor first where it shares its offset with another (safetensors' writer puts
  // an empty F32 tensor at the offset where the next dtype's tensors begin). An empty range overlaps nothing.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The tensors' bytes must tile the data exactly, as the format (and its reference reader) requires: bytes that no
  // tensor owns mean the header does not describe this file (a file cut and padded, two files joined).
  uint64_t end = 0;
  const std::string* last = nullptr;
  for (const auto& e : entries) {
    if (e.begin == e.end) continue;
    if (last && e.begin < end)
      DPT_THROW(CheckpointError, "{}: tensors {} and {} overlap", path, *last, e.nt.name);
    if (e.begin > end)
      DPT_THROW(CheckpointError, "{}: data bytes [{}, {}) belong to no tensor (before {}): the header does not "
                "describe this file (corrupted?)", path, end, e.begin, e.nt.name);
    end = e.end;
    last = &e.nt.name;
  }
  if (end != data_size)
    DPT_THROW(CheckpointError, "{}: {} data bytes after the last tensor's: the header does not describe this file "
              "(two files joined, or corrupted?)", path, data_size - end);
}

}  // namespace

uint32_t crc32_of(const void* data, size_t bytes, uint32_t start) {
  uLong crc = start;
  const Bytef* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {  // zlib takes uInt lengths
    uInt chunk = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    bytes -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& nt : tensors)
    if (nt.name == name) return &nt.tensor;
  return nullptr;
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       std::map<std::string, std::string> metadata) {
  metadata.try_emplace("format", kFormat);  // a caller's own "format" stands (the fuzz round trip keeps a file's)
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& nt : tensors) {
    DPT_CHECK(nt.tensor.device().is_cpu(), "{}: copy {} to the host before writing", path, nt.name);
    DPT_CHECK(nt.name != "__metadata__" && !header.contains(nt.name), "{}: bad or repeated tensor name {}", path, nt.name);
    header[nt.name] = {{"dtype", st_dtype(nt.tensor.dtype())},
                       {"shape", nt.tensor.shape()},
                       {"data_offsets", {offset, offset + nt.tensor.bytes()}}};
    metadata["crc32:" + nt.name] = fmt::format("{:08x}", crc32_of(nt.tensor.raw(), nt.tensor.bytes()));
    offset += nt.tensor.bytes();
  }
  header["__metadata__"] = metadata;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data to 8 bytes, as the reference writer does
  const uint64_t hlen = h.size();
  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(hlen >> (8 * i));

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) DPT_THROW(CheckpointError, "cannot create {}: {}", path, std::strerror(errno));
  try {
    write_all(fd, len_le, 8, path);
    write_all(fd, h.data(), h.size(), path);
    for (const auto& nt : tensors) write_all(fd, nt.tensor.raw(), nt.tensor.bytes(), path);
    if (::fsync(fd) != 0) DPT_THROW(CheckpointError, "fsync {}: {}", path, std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) DPT_THROW(CheckpointError, "closing {}: {}", path, std::strerror(errno));
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DPT_THROW(CheckpointError, "{}: cannot open: {}", path, std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const uint64_t size = bytes.size();
  if (size < 8) DPT_THROW(CheckpointError, "{}: truncated: {} bytes, a safetensors file has at least 8", path, size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<uint8_t>(bytes[i]);
  if (hlen > kMaxHeaderBytes || 8 + hlen > size)
    DPT_THROW(CheckpointError, "{}: header length {} does not fit in the file ({} bytes): truncated or not safetensors",
              path, hlen, size);
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(hlen));
  } catch (const json::exception& e) {
    DPT_THROW(CheckpointError, "{}: header is not valid JSON: {}", path, e.what());
  }
  if (!header.is_object()) DPT_THROW(CheckpointError, "{}: header is not a JSON object", path);

  SafetensorsFile out;
  const uint64_t data_size = size - 8 - hlen;
  const char* data = bytes.data() + 8 + hlen;
  std::vector<Entry> entries;
  try {
    if (header.contains("__metadata__"))
      for (auto& [k, v] : header["__metadata__"].items()) out.metadata[k] = v.get<std::string>();
    for (auto& [name, info] : header.items()) {
      if (name == "__metadata__") continue;
      const json& dtype_text = info.at("dtype");
      const Widened* wide = dtype_text.is_string() ? widened(dtype_text.get<std::string>()) : nullptr;
      auto dtype = wide ? std::optional<DType>(wide->to) : parse_st_dtype(dtype_text.get<std::string>());
      if (!dtype)
        DPT_THROW(CheckpointError, "{}: tensor {} has dtype {}, which dptrain does not read (it reads F32, F16, BF16, "
                  "F64, I64, I32, I16, I8, U8 and BOOL)", path, name, dtype_text.dump());
      // Integers only: nlohmann reads a number too large for 64 bits as a double, and converting that to an
      // integer is undefined (found by tests/fuzz: a dimension of 2.2e38).
      for (const char* key : {"shape", "data_offsets"}) {
        const json& list = info.at(key);
        if (!list.is_array() || !std::all_of(list.begin(), list.end(), [](const json& v) { return v.is_number_integer(); }))
          DPT_THROW(CheckpointError, "{}: tensor {} has a {} that is not a list of 64-bit integers: {}", path, name, key,
                    list.dump());
      }
      auto shape = info.at("shape").get<std::vector<int64_t>>();
      auto offs = info.at("data_offsets").get<std::vector<uint64_t>>();
      if (offs.size() != 2 || offs[0] > offs[1] || offs[1] > data_size)
        DPT_THROW(CheckpointError, "{}: tensor {} byte range {} lies outside the {} data bytes (truncated?)", path, name,
                  info.at("data_offsets").dump(), data_size);
      // The shape's size, checked before allocating: a hostile shape must neither allocate terabytes nor
      // wrap around to the range's length ([2^32, 2^32] of U8 "fitted" 0 bytes: found by tests/fuzz).
      uint64_t need = wide ? wide->bytes : dtype_size(*dtype);
      for (int64_t d : shape) {
        if (d < 0 || __builtin_mul_overflow(need, static_cast<uint64_t>(d), &need))
          DPT_THROW(CheckpointError, "{}: tensor {} has an impossible shape {}", path, name, info.at("shape").dump());
      }
      if (need != offs[1] - offs[0])
        DPT_THROW(CheckpointError, "{}: tensor {} shape [{}] needs {} bytes, its range holds {}", path, name,
                  fmt::join(shape, ", "), need, offs[1] - offs[0]);
      Tensor t = Tensor::empty(shape, *dtype);
      if (wide) {
        widen(*wide, data + offs[0], t);
      } else {
        std::memcpy(t.raw(), data + offs[0], t.bytes());
      }
      auto crc = out.metadata.find("crc32:" + name);
      if (crc != out.metadata.end()) {
        std::string actual = fmt::format("{:08x}", crc32_of(data + offs[0], offs[1] - offs[0]));
        if (actual != crc->second)
          DPT_THROW(CheckpointError, "{}: tensor {} is corrupted: CRC32 {} but the header says {}", path, name, actual,
                    crc->second);
      }
      entries.push_back({offs[0], offs[1], {name, std::move(t)}});
    }
  } catch (const json::exception& e) {
    DPT_THROW(CheckpointError, "{}: malformed header: {}", path, e.what());
  }
  check_tiling(entries, data_size, path);
  for (auto& e : entries) out.tensors.push_back(std::move(e.nt));
  return out;
}

}  // namespace dpt
