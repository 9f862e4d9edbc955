// tests/tools/llama_io.cpp: dpt-llama-io, the C++ half of the Llama parity test (integration.llama_hf_parity): builds
// a Llama from a Hugging Face model folder exactly as `dptrain` does (model.init_from = the folder: its config.json
// resolved into the model.* keys, its weights through the family's import), runs one forward and backward of the
// mean softmax cross-entropy over every position of batch 0, then `--steps` AdamW steps (the trainer's optimizer,
// weight decay on matrices only, as train.weight_decay_params = auto) over the batches in turn, and writes for
// tests/support/python/llama_hf.py to compare with transformers:
//   OUT/out.safetensors    logits [B*T, V], loss, grad.<param> of batch 0, and loss.<i> of every step
//   OUT/state.safetensors  the weights after the steps (LlamaForCausalLM's names)
// INPUT holds x.<i> [B, T] (the tokens) and y.<i> [B, T] (the next tokens), i = 0, 1, ..., int64 or int32.
#include <CLI/CLI.hpp>

#include <iostream>

#include "core/check.h"
#include "core/safetensors.h"
#include "step_output.h"
#include "trainer/build_model.h"
#include "trainer/model_registry.h"
#include "trainer/optimizer.h"

int main(int argc, char** argv) {
  using namespace dpt;
  CLI::App app{"dpt-llama-io: a dptrain Llama from a Hugging Face folder, one forward/backward and AdamW steps"};
  std::string model_dir, input, out;
  int steps = 0;
  trainer::TrainConfig tc;
  tc.optimizer = trainer::OptimizerKind::adamw;
  tc.lr = 1e-3;
  tc.weight_decay = 0.1;
  tc.beta2 = 0.95;
  app.add_option("--model", model_dir, "a Hugging Face model folder (config.json and weights)")->required();
  app.add_option("--input", input, "safetensors with x.<i> and y.<i> [B, T]")->required()->check(CLI::ExistingFile);
  app.add_option("--out", out, "directory for out.safetensors and state.safetensors")->required();
  app.add_option("--steps", steps, "AdamW steps after the first forward/backward");
  app.add_option("--lr", tc.lr);
  app.add_option("--weight-decay", tc.weight_decay);
  CLI11_PARSE(app, argc, argv);
  try {
    const SafetensorsFile in = read_safetensors(input);
    std::vector<Tensor> xs, ys;
    for (int i = 0; in.find("x." + std::to_string(i)); ++i) {
      xs.push_back(test::as_i32(*in.find("x." + std::to_string(i))));
      const Tensor* y = in.find("y." + std::to_string(i));
      DPT_CHECK(y && y->shape() == xs.back().shape() && y->ndim() == 2, "{}: y.{} [B, T] missing", input, i);
      ys.push_back(test::as_i32(*y));
    }
    DPT_CHECK(!xs.empty(), "{} holds no x.0", input);

    trainer::ModelConfig m;
    m.name = "llama";
    m.init_from = model_dir;
    m.block_size = xs[0].dim(1);
    std::cerr << trainer::resolve_model_config(m) << "\n";
    auto model = trainer::build_model(m, {m.block_size + 1}, 0, Device::cpu());
    model->init(1);
    std::cerr << "weights: " << trainer::load_pretrained(*model, m, model_dir) << "\n";

    models::SoftmaxCrossEntropy loss;
    Tensor logits;  // batch 0's, before any step
    auto step = [&](size_t i) {
      model->zero_grad();
      const Tensor& out = model->forward(xs[i]);
      if (!logits.defined()) {
        logits = Tensor::empty(out.shape());
        logits.copy_from(out);
      }
      const models::LossResult r =
          loss.forward_backward(out, ys[i].reshape({static_cast<int64_t>(ys[i].numel())}), model->kernels());
      model->backward(loss.grad());
      return r;
    };
    const models::LossResult first = step(0);
    std::vector<NamedTensor> grads;
    for (const auto& np : model->named_params()) {
      Tensor g = Tensor::empty(np.grad.shape());
      g.copy_from(np.grad);
      grads.push_back({np.name, g});
    }
    trainer::Optimizer opt(tc, *model, /*decay_matrices_only=*/true);
    std::vector<NamedTensor> extra;
    for (int s = 0; s < steps; ++s) {
      const models::LossResult r = step(static_cast<size_t>(s) % xs.size());
      opt.step(tc.lr);
      Tensor l = Tensor::empty({}, DType::F64);
      l.data<double>()[0] = r.loss_sum / static_cast<double>(r.count);
      extra.push_back({"loss." + std::to_string(s), l});
    }
    test::write_step_tensors(out, logits, first, grads, model->state(), extra);
    std::cout << model->summary() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "dpt-llama-io: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
