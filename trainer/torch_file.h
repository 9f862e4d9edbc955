// trainer/torch_file.h: PyTorch's own weight files, read without Python and without running any of their code.
//
// torch.save (since PyTorch 1.6) writes a zip archive: ARCHIVE/data.pkl, a pickle of the saved object in which every
// tensor's storage is a persistent id ('storage', torch.FloatStorage, KEY, LOCATION, NUMEL) naming the raw bytes in
// ARCHIVE/data/KEY, and a tensor is torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...). torchvision's
// downloads (.pth) and older Hugging Face repositories (pytorch_model.bin) are such files holding a state dict.
//
// The pickle is read by a restricted machine: only the opcodes a state dict needs (protocol 2, as torch.save
// writes, and protocol 4's FRAME, MEMOIZE and STACK_GLOBAL), and only these globals: collections.OrderedDict,
// torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter, and the typed storages torch.FloatStorage,
// DoubleStorage, HalfStorage, BFloat16Storage, LongStorage, IntStorage, ShortStorage, CharStorage, ByteStorage,
// BoolStorage. Anything else (os.system, builtins.eval, a module's class, NEWOBJ, INST, ...) is refused naming it:
// a torch file is a program for Python's unpickler, and this one runs none of it. Every length, index, shape,
// stride and offset is checked against the bytes there are; containers live in an arena (at most 2^21 objects, and
// data.pkl at most 64 MiB), so cycles and depth cost nothing; every entry's CRC-32 is checked. The legacy format
// (before 1.6, not a zip) is refused with a message saying how to convert it.
//
// Tensors come out contiguous (a non-contiguous one gathered by its strides; views of one storage each their own
// copy, at most four times the storages' size in all): float32, float64, bfloat16, int64, int32 and uint8 as they are; float16 widened to float32 (exactly);
// int16 and int8 widened to int32, bool as uint8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/safetensors.h"

namespace dpt::trainer {

// Whether the bytes start as a zip archive (PK\3\4) does: the torch.save format, not safetensors; or as the legacy
// format (before PyTorch 1.6) does.
bool looks_like_zip(const uint8_t* data, size_t size);
bool looks_like_legacy_torch(const uint8_t* data, size_t size);

// A state dict from torch.save's zip format: names -> tensors in file order (SafetensorsFile, its metadata empty).
// The top-level object must be a dict of tensors, or hold one under 'state_dict', 'model' or 'model_state_dict'
// (PyTorch's tutorial's): a training checkpoint's layout. Throws CheckpointError naming `where` and the problem.
SafetensorsFile read_torch_zip(const uint8_t* data, size_t size, const std::string& where);
SafetensorsFile read_torch_file(const std::string& path);

// The restricted unpickler alone, over data.pkl's bytes: `storage(key)` gives the bytes of ARCHIVE/data/KEY (null
// when there is no such entry).
using StorageBytes = std::function<const std::vector<uint8_t>*(const std::string& key)>;
SafetensorsFile unpickle_state_dict(const uint8_t* pkl, size_t size, const StorageBytes& storage,
                                    const std::string& where);

// Weights from a file, whichever of the two formats it is in: safetensors, or torch.save's zip.
SafetensorsFile read_weights_file(const std::string& path);

// IEEE half precision to float32, exactly (core/half.h).
using dpt::half_to_float;

}  // namespace dpt::trainer
