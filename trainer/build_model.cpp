// trainer/build_model.cpp: model.* config -> a Model (its family's, trainer/model_registry.h); model.init_from -> its
// starting weights.
#include "trainer/build_model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/bfloat16.h"
#include "core/safetensors.h"
#include "trainer/model_registry.h"
#include "trainer/torch_file.h"

namespace dpt::trainer {

std::unique_ptr<models::Model> build_model(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                           int64_t data_classes, Device device) {
  return model_family(m.name).build(m, sample_shape, data_classes, device);
}

namespace {
// A bf16 or float64 host tensor as float32 (bf16 exactly; float64 rounded to nearest).
Tensor widen_to_f32(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::F32);
  float* o = out.data<float>();
  for (size_t i = 0; i < t.numel(); ++i)
    o[i] = t.dtype() == DType::BF16 ? to_float(t.data<BFloat16>()[i]) : static_cast<float>(t.data<double>()[i]);
  return out;
}
namespace fs = std::filesystem;

// A sharded checkpoint: `index` (model.safetensors.index.json, pytorch_model.bin.index.json) maps every tensor to the
// file beside it that holds it; each file is read once, in name order, and must hold the tensors mapped to it.
SafetensorsFile read_sharded(const fs::path& index) {
  std::ifstream f(index, std::ios::binary);
  std::ostringstream text;
  text << f.rdbuf();
  if (!f) DPT_THROW(IoError, "reading {}", index.string());
  std::map<std::string, std::set<std::string>> by_file;  // shard -> the tensors the index puts there
  try {
    const auto j = nlohmann::json::parse(text.str());
    for (const auto& [name, file] : j.at("weight_map").items()) by_file[file.get<std::string>()].insert(name);
  } catch (const nlohmann::json::exception& e) {
    DPT_THROW(IoError, "{}: not a shard index (an object with a weight_map of tensor names to files): {}",
              index.string(), e.what());
  }
  SafetensorsFile all;
  for (const auto& [file, names] : by_file) {
    if (file.find('/') != std::string::npos || file.starts_with("."))
      DPT_THROW(IoError, "{}: shard '{}' is not a file name beside the index", index.string(), file);
    SafetensorsFile shard = read_weights_file((index.parent_path() / file).string());
    for (const std::string& name : names)
      if (!shard.find(name))
        DPT_THROW(IoError, "{}: the index puts {} in {}, which does not hold it", index.string(), name, file);
    for (auto& nt : shard.tensors)
      if (names.count(nt.name)) all.tensors.push_back(std::move(nt));
  }
  return all;
}

}  // namespace

SafetensorsFile read_weights(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return read_weights_file(path);
  const fs::path dir(path);
  // transformers' order: safetensors before pytorch_model.bin, a whole file before an index.
  for (const char* name : {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                           "pytorch_model.bin.index.json"}) {
    const fs::path p = dir / name;
    if (!fs::is_regular_file(p, ec)) continue;
    return std::string_view(name).ends_with(".index.json") ? read_sharded(p) : read_weights_file(p.string());
  }
  DPT_THROW(IoError, "{} is a folder without weights: it holds none of model.safetensors, "
            "model.safetensors.index.json (and its shards), pytorch_model.bin, pytorch_model.bin.index.json", path);
}

namespace {

// model.init_from's file as float32 where it holds other floats (bf16 or float64 files become the dtype of every
// model's parameters and buffers before a family's layout import reads them); a file that cannot be read is the
// config's error.
SafetensorsFile read_init_weights(const std::string& path) {
  SafetensorsFile file;
  try {
    file = read_weights(path);  // safetensors, torch.save's zip (a .pth, a pytorch_model.bin), or a folder of them
  } catch (const Error& e) {
    DPT_THROW(ConfigError, "model.init_from: {}", e.what());
  }
  for (auto& nt : file.tensors)
    if (nt.tensor.dtype() == DType::BF16 || nt.tensor.dtype() == DType::F64) nt.tensor = widen_to_f32(nt.tensor);
  return file;
}

constexpr std::string_view kCompiledPrefix = "_orig_mod.", kDdpPrefix = "module.";

// What strip_wrapper_prefixes removed, and the file's own name of each tensor that lost a prefix (for errors).
struct Unwrapped {
  size_t compiled = 0, ddp = 0;
  std::map<std::string, std::string> file_names;
  std::string file_name(const std::string& name) const {
    const auto it = file_names.find(name);
    return it != file_names.end() ? fmt::format("{} (the file's {})", name, it->second) : name;
  }
};

// Wrappers' prefixes, removed: torch.compile's puts "_orig_mod." before every name of its module's state_dict
// (nanoGPT's ckpt.pt from train.py with compile = True), removed where present, as nanoGPT's sample.py removes it;
// DistributedDataParallel's puts "module." before every name (a state dict saved from the wrapper instead of its
// .module), removed when every name has it, as torch's consume_prefix_in_state_dict_if_present does (a model's own
// submodule may be called "module"). Repeated while one is found: DDP of a compiled model, or the other way round.
Unwrapped strip_wrapper_prefixes(std::vector<NamedTensor>& tensors) {
  Unwrapped u;
  for (bool found = true; found;) {
    found = false;
    const auto strip = [&](NamedTensor& nt, std::string_view prefix) {
      const auto it = u.file_names.find(nt.name);
      std::string original = it != u.file_names.end() ? it->second : nt.name;
      if (it != u.file_names.end()) u.file_names.erase(it);
      nt.name.erase(0, prefix.size());
      u.file_names[nt.name] = std::move(original);
      found = true;
    };
    for (auto& nt : tensors)
      if (nt.name.starts_with(kCompiledPrefix)) {
        strip(nt, kCompiledPrefix);
        ++u.compiled;
      }
    if (!tensors.empty() && std::all_of(tensors.begin(), tensors.end(), [&](const NamedTensor& nt) {
          return nt.name.starts_with(kDdpPrefix);
        })) {
      for (auto& nt : tensors) strip(nt, kDdpPrefix);
      u.ddp += tensors.size();
    }
  }
  return u;
}

// The classifier head (the last parameter pair, for a family that re-initialises it) where the file's has another
// class count: those names, whose fresh tensors stand in for the file's in `keep` (fine-tuning).
std::vector<std::string> fresh_head(const models::Model& model, const ModelFamily& family,
                                    const std::vector<NamedTensor>& state, const SafetensorsFile& file,
                                    std::map<std::string, Tensor>& keep) {
  const auto& params = model.named_params();
  std::set<std::string> head;
  if (params.size() >= 2 && family.reinit_head) {
    head.insert(params[params.size() - 2].name);
    head.insert(params.back().name);
  }
  std::vector<std::string> reinit;
  for (const auto& nt : state) {
    const Tensor* src = file.find(nt.name);
    if (src && head.count(nt.name) && src->shape() != nt.tensor.shape() && src->ndim() == nt.tensor.ndim() &&
        src->ndim() >= 1 && std::equal(src->shape().begin() + 1, src->shape().end(), nt.tensor.shape().begin() + 1))
      reinit.push_back(nt.name);
  }
  for (const auto& name : reinit)
    for (const auto& nt : state)
      if (nt.name == name) keep[name] = nt.tensor.to(Device::cpu());
  return reinit;
}

// BatchNorm's num_batches_tracked, which torchvision's downloads from before 0.4.1 lack: 0 in `keep` where the file
// has none, as PyTorch's BatchNorm loads such a state dict (load_state_dict(strict=True) accepts it). Any other
// tensor the file lacks stays an error. Returns how many.
size_t untracked_batches(const std::vector<NamedTensor>& state, const SafetensorsFile& file,
                         std::map<std::string, Tensor>& keep) {
  size_t untracked = 0;
  for (const auto& nt : state)
    if ((nt.name == "num_batches_tracked" || nt.name.ends_with(".num_batches_tracked")) &&
        nt.tensor.dtype() == DType::I64 && !file.find(nt.name)) {
      Tensor zero = Tensor::empty({}, DType::I64);
      zero.data<int64_t>()[0] = 0;
      keep[nt.name] = zero;
      ++untracked;
    }
  return untracked;
}

}  // namespace

std::string load_pretrained(models::Model& model, const ModelConfig& m, const std::string& path) {
  SafetensorsFile file = read_init_weights(path);
  const Unwrapped unwrapped = strip_wrapper_prefixes(file.tensors);
  const auto state = model.state();
  const ModelFamily& family = model_family(m.name);
  std::string layout;
  std::vector<std::string> file_names;  // as the file names them (wrappers' prefixes removed), for errors
  for (const auto& nt : file.tensors) file_names.push_back(nt.name);
  if (family.import_weights) file.tensors = family.import_weights(file.tensors, path, m, &layout);
  std::set<std::string> wanted;
  for (const auto& nt : state) wanted.insert(nt.name);
  for (const auto& nt : file.tensors)
    if (!wanted.count(nt.name))
      DPT_THROW(ConfigError, "model.init_from {}: tensor {} is not in this model ({}): a different architecture?",
                path, unwrapped.file_name(nt.name), model.summary());
  std::map<std::string, Tensor> keep;  // tensors standing in for the file's: a fresh head, zero counters
  const std::vector<std::string> reinit = fresh_head(model, family, state, file, keep);
  const size_t untracked = untracked_batches(state, file, keep);
  try {
    model.load_state(
        [&](const std::string& name) -> const Tensor* {
          auto it = keep.find(name);
          return it != keep.end() ? &it->second : file.find(name);
        },
        "model.init_from " + path,
        [&](const std::string& name) { return family.file_name ? family.file_name(file_names, name) : name; });
  } catch (const CheckpointError& e) {
    DPT_THROW(ConfigError, "{}", e.what());
  }
  std::vector<std::string> notes;
  if (family.import_weights) notes.push_back(layout);
  if (!reinit.empty())
    notes.push_back(fmt::format("{} has {} classes in {}, the model {}: {} re-initialised (fine-tuning)",
                                reinit.front(), file.find(reinit.front())->dim(0), path,
                                model.named_params().back().param.dim(0), fmt::join(reinit, " and ")));
  if (untracked)
    notes.push_back(fmt::format("{} num_batches_tracked absent from the file: 0, as PyTorch's BatchNorm loads them",
                                untracked));
  if (unwrapped.compiled)
    notes.push_back(fmt::format("torch.compile's {} prefix removed from {} names", kCompiledPrefix,
                                unwrapped.compiled));
  if (unwrapped.ddp)
    notes.push_back(fmt::format("DistributedDataParallel's {} prefix removed from {} names", kDdpPrefix,
                                unwrapped.ddp));
  return fmt::format("{}", fmt::join(notes, "; "));
}

double train_flops_per_row(const ModelConfig& m) {
  const ModelFamily& family = model_family(m.name);
  return family.flops_per_row ? family.flops_per_row(m) : 0.0;
}

}  // namespace dpt::trainer
