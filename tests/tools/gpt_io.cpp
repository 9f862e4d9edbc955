// tests/tools/gpt_io.cpp: dpt-gpt-io, the C++ half of the GPT parity test: builds a GPT of the given shape,
// loads weights as model.init_from does (nanoGPT's or Hugging Face's layout), runs one forward and backward with the mean softmax cross-entropy over every
// position, and writes what it saw for tests/support/python/torch_gpt.py to compare with PyTorch:
//   OUT/out.safetensors    logits [B*T, V], loss, grad.<param>
//   OUT/state.safetensors  the model's weights in nanoGPT's layout (models::gpt_export_weights)
//   OUT/hf.safetensors     the same in Hugging Face's GPT-2 layout
// The logits and wte's gradient are cut to the real vocabulary; their padding (-inf, 0) is checked here.
// X holds x [B, T] (the tokens) and y [B, T] (the next tokens), int64 or int32.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "core/check.h"
#include "core/safetensors.h"
#include "models/gpt/gpt.h"
#include "models/gpt/weights.h"
#include "step_output.h"
#include "trainer/build_model.h"

int main(int argc, char** argv) {
  using namespace dpt;
  CLI::App app{"dpt-gpt-io: one forward/backward of a dptrain GPT on given tokens (PyTorch parity tests)"};
  std::string input, out, weights, precision = "fp32";
  models::GptOptions o;
  app.add_option("--input", input, "safetensors with x [B, T] and y [B, T]")->required()->check(CLI::ExistingFile);
  app.add_option("--weights", weights, "safetensors weights, nanoGPT's names")->required()->check(CLI::ExistingFile);
  app.add_option("--out", out, "directory for out.safetensors and state.safetensors")->required();
  app.add_option("--n-layer", o.n_layer)->required();
  app.add_option("--n-head", o.n_head)->required();
  app.add_option("--n-embd", o.n_embd)->required();
  app.add_option("--vocab", o.vocab_size)->required();
  app.add_option("--block", o.block_size)->required();
  app.add_option("--precision", precision)->check(CLI::IsMember({"fp32", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  try {
    const SafetensorsFile in = read_safetensors(input);
    const Tensor* x = in.find("x");
    const Tensor* y = in.find("y");
    DPT_CHECK(x && y && x->ndim() == 2 && y->shape() == x->shape(), "{} needs x and y [B, T]", input);
    const Tensor tokens = test::as_i32(*x), labels = test::as_i32(*y);

    auto model = models::make_gpt(o);
    model->init(1);
    // model.init_from's own path: nanoGPT's or Hugging Face's layout, the tied head checked.
    trainer::ModelConfig m;  // the same GPT as model.* keys, for the GPT family's layouts
    m.name = "gpt";
    m.n_layer = o.n_layer;
    m.n_head = o.n_head;
    m.n_embd = o.n_embd;
    m.vocab_size = o.vocab_size;
    m.block_size = o.block_size;
    std::cerr << "weights: " << trainer::load_pretrained(*model, m, weights) << "\n";
    if (precision == "bf16") model->set_precision(models::Precision::BF16);

    models::SoftmaxCrossEntropy loss;
    model->zero_grad();
    const Tensor& logits = model->forward(tokens);
    Tensor logits_copy = Tensor::empty(logits.shape());
    logits_copy.copy_from(logits);
    const models::LossResult r =
        loss.forward_backward(logits, labels.reshape({static_cast<int64_t>(labels.numel())}), model->kernels());
    model->backward(loss.grad());

    // The vocabulary padding stays inside: -inf logits and zero gradients there, cut off for torch.
    const int64_t v = o.vocab_size, vp = models::padded_vocab(o), rows = logits_copy.dim(0);
    Tensor logits_v = Tensor::empty({rows, v});
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = logits_copy.data<float>() + i * vp;
      std::copy_n(row, v, logits_v.data<float>() + i * v);
      for (int64_t j = v; j < vp; ++j)
        DPT_CHECK(std::isinf(row[j]) && row[j] < 0, "padding logit [{}, {}] is {}, not -inf", i, j, row[j]);
    }
    std::vector<NamedTensor> grads;
    for (const auto& np : model->named_params()) {
      if (np.name != "transformer.wte.weight") {
        grads.push_back({np.name, np.grad});
        continue;
      }
      for (size_t i = static_cast<size_t>(v * o.n_embd); i < np.grad.numel(); ++i)
        DPT_CHECK(np.grad.data<float>()[i] == 0.0f, "wte's padding rows have a gradient");
      grads.push_back({np.name, np.grad.view(0, {v, o.n_embd})});
    }
    test::write_step_tensors(out, logits_v, r, grads, models::gpt_export_weights(*model, models::GptLayout::NanoGpt));
    write_safetensors(out + "/hf.safetensors", models::gpt_export_weights(*model, models::GptLayout::HuggingFace));
    std::cout << model->summary() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "dpt-gpt-io: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
