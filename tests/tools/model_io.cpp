// tests/tools/model_io.cpp: dpt-model-io, the C++ half of the PyTorch parity tests: builds the model a config
// describes, loads weights (torchvision names), runs one training-mode forward and backward with the mean
// softmax cross-entropy on a given batch, and writes what it saw, for tests/support/python/torch_resnet.py
// to compare with PyTorch:
//   OUT/out.safetensors    logits, loss, grad.<param>, every buffer after the forward, eval_logits (the
//                          evaluation-mode forward after it)
//   OUT/state.safetensors  the model's whole state after the forward (what a checkpoint holds)
// Usage: dpt-model-io --input X.safetensors --out DIR [--weights W.safetensors] [key=value ...]
// X holds x [N, C, H, W] float32 and y [N] int64 or int32.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <set>

#include "core/check.h"
#include "core/safetensors.h"
#include "models/model.h"
#include "trainer/build_model.h"
#include "trainer/config.h"
#include "step_output.h"

int main(int argc, char** argv) {
  using namespace dpt;
  CLI::App app{"dpt-model-io: one forward/backward of a dptrain model on a given batch (PyTorch parity tests)"};
  std::string input, out, weights;
  std::vector<std::string> overrides;
  app.add_option("--input", input, "safetensors with x [N,C,H,W] and y [N]")->required()->check(CLI::ExistingFile);
  app.add_option("--out", out, "directory for out.safetensors and state.safetensors")->required();
  app.add_option("--weights", weights, "safetensors weights to load (model.init_from semantics)");
  app.add_option("overrides", overrides, "config overrides (model.*)");
  CLI11_PARSE(app, argc, argv);
  try {
    const trainer::Config cfg = trainer::load_config("", overrides);
    const SafetensorsFile in = read_safetensors(input);
    const Tensor* x = in.find("x");
    const Tensor* y = in.find("y");
    DPT_CHECK(x && y && x->ndim() == 4 && x->dtype() == DType::F32, "{} needs x [N,C,H,W] float32 and y", input);
    Tensor labels = Tensor::empty({x->dim(0)}, DType::I32);
    for (int64_t i = 0; i < x->dim(0); ++i)
      labels.data<int32_t>()[i] = y->dtype() == DType::I64 ? static_cast<int32_t>(y->data<int64_t>()[i]) : y->data<int32_t>()[i];

    auto model = trainer::build_model(cfg.model, {x->dim(1), x->dim(2), x->dim(3)}, cfg.model.num_classes, Device::cpu());
    model->init(static_cast<uint64_t>(cfg.train.seed));
    model->set_precision(cfg.train.precision);
    if (!weights.empty()) {
      const std::string note = trainer::load_pretrained(*model, cfg.model, weights);
      if (!note.empty()) std::cerr << note << "\n";
    }
    models::SoftmaxCrossEntropy loss;
    model->zero_grad();
    const Tensor& logits = model->forward(*x);
    Tensor logits_copy = Tensor::empty(logits.shape());
    logits_copy.copy_from(logits);
    const models::LossResult r = loss.forward_backward(logits, labels, model->kernels());
    model->backward(loss.grad());

    std::vector<NamedTensor> extra;
    std::set<std::string> params;
    for (const auto& np : model->named_params()) params.insert(np.name);
    for (const auto& nt : model->state())  // the rest of the state: buffers and counters (num_batches_tracked)
      if (!params.count(nt.name)) extra.push_back(nt);
    model->set_training(false);
    extra.push_back({"eval_logits", model->forward(*x)});
    test::write_step_output(out, *model, logits_copy, r, extra);
  } catch (const std::exception& e) {
    std::cerr << "dpt-model-io: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
