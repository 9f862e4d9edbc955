// core/safetensors.h: read and write the safetensors format (8-byte little-endian header length, a JSON
// header naming each tensor's dtype, shape and byte range, then the raw bytes), readable by PyTorch's and
// numpy's safetensors loaders. We add a CRC32 of every tensor to the header's __metadata__ as
// "crc32:<name>" and check it on read, so a flipped byte is caught, not trained on. Every file we write says
// {"format": "pt"} in its metadata, as PyTorch's writer does: Hugging Face transformers' from_pretrained refuses a
// file without it ("File metadata is not ['pt', 'tf', 'flax', 'mlx'] but None").
// A file format beside the tensors it makes: checkpoints (trainer/checkpoint), weights a model starts from
// (model.init_from) and exported weights all read and write it without the trainer.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dpt {

// Writes the file and fsyncs it. Tensors must be on the CPU and contiguous. `metadata` gets "format": "pt" unless
// it names a format (no caller of ours does), and the tensors' CRC32s.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       std::map<std::string, std::string> metadata = {});

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  const Tensor* find(const std::string& name) const;
};

// Reads and validates: header size within the file, valid JSON, known dtypes, shapes matching byte ranges,
// ranges tiling the data (no overlap, no byte that no tensor owns, as the format requires), every tensor's CRC32
// (when present). Throws CheckpointError
// naming the file and what is wrong, and one naming the tensor, its dtype and the dtypes dptrain reads for any
// other dtype (U16, F8_E4M3, ...). F16 tensors (fp16 weights) come back as float32, exactly; I8 and I16 as int32;
// BOOL as uint8 (0 or 1), as PyTorch's files read (a GPT-2 file's causal-mask buffers, which a GPT skips).
SafetensorsFile read_safetensors(const std::string& path);

// zlib's CRC-32 of `bytes` at `data`; `crc`: the CRC of what came before (0 for none), to take one in pieces.
uint32_t crc32_of(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace dpt
