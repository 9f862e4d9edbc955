// trainer/build_model.cpp: model.* config -> a Model (its family's, trainer/model_registry.h); model.init_from -> its
// starting weights.
#include "trainer/build_model.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/bfloat16.h"
#include "core/safetensors.h"
#include "trainer/model_registry.h"
#include "trainer/torch_file.h"

namespace dpt::trainer {

std::unique_ptr<models::Model> build_model(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                           int64_t data_classes, Device device) {
  return model_family(m.name).build(m, sample_shape, m.num_classes > 0 ? m.num_classes : data_classes, device);
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
}  // namespace

std::string load_pretrained(models::Model& model, const ModelConfig& m, const std::string& path) {
  SafetensorsFile file;
  try {
    file = read_weights_file(path);  // safetensors, or torch.save's zip (a .pth, a pytorch_model.bin)
  } catch (const Error& e) {
    DPT_THROW(ConfigError, "model.init_from: {}", e.what());
  }
  // Floating weights in another precision (bf16 or float64 files) become float32, the dtype of every model's
  // parameters and buffers, before a family's layout import reads them.
  for (auto& nt : file.tensors)
    if (nt.tensor.dtype() == DType::BF16 || nt.tensor.dtype() == DType::F64) nt.tensor = widen_to_f32(nt.tensor);
  const auto state = model.state();
  const ModelFamily& family = model_family(m.name);
  std::string layout;
  if (family.import_weights) file.tensors = family.import_weights(file.tensors, path, m, &layout);
  std::set<std::string> wanted;
  for (const auto& nt : state) wanted.insert(nt.name);
  for (const auto& nt : file.tensors)
    if (!wanted.count(nt.name))
      DPT_THROW(ConfigError, "model.init_from {}: tensor {} is not in this model ({}): a different architecture?",
                path, nt.name, model.summary());
  // The classifier head: the last parameter pair. A different class count there keeps the fresh head.
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
  std::map<std::string, Tensor> keep;  // the fresh head, standing in for the file's
  for (const auto& name : reinit)
    for (const auto& nt : state)
      if (nt.name == name) keep[name] = nt.tensor.to(Device::cpu());
  try {
    model.load_state(
        [&](const std::string& name) -> const Tensor* {
          auto it = keep.find(name);
          return it != keep.end() ? &it->second : file.find(name);
        },
        "model.init_from " + path);
  } catch (const CheckpointError& e) {
    DPT_THROW(ConfigError, "{}", e.what());
  }
  if (family.import_weights) return fmt::format("{} layout", layout);
  if (reinit.empty()) return "";
  const Tensor* w = file.find(reinit.front());
  return fmt::format("{} has {} classes in {}, the model {}: {} re-initialised (fine-tuning)", reinit.front(),
                     w->dim(0), path, params.back().param.dim(0), fmt::join(reinit, " and "));
}

double train_flops_per_row(const ModelConfig& m) {
  const ModelFamily& family = model_family(m.name);
  return family.flops_per_row ? family.flops_per_row(m) : 0.0;
}

}  // namespace dpt::trainer
