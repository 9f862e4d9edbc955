// trainer/commands/export_weights.cpp: `dptrain export-weights`: a GPT checkpoint as one safetensors file other
// programs load (Hugging Face's GPT-2 layout or nanoGPT's state_dict).
#include <spdlog/spdlog.h>

#include "trainer/build_model.h"
#include "trainer/commands/commands.h"
#include "trainer/gpt_checkpoint.h"

namespace dpt::trainer::commands {
namespace {

struct ExportWeightsArgs {
  std::string checkpoint, layout = "hf", out;
};

}  // namespace

Command add_export_weights(CLI::App& root) {
  auto a = std::make_shared<ExportWeightsArgs>();
  CLI::App* cmd = root.add_subcommand(
      "export-weights", "write a GPT checkpoint's weights as one safetensors file for other programs: Hugging Face's "
                        "GPT-2 layout (transformers' GPT2LMHeadModel.from_pretrained) or nanoGPT's state_dict; trains "
                        "nothing");
  cmd->footer(
      "Example: dptrain export-weights --checkpoint runs/gpt_tiny/checkpoints --out gpt_tiny.safetensors\n"
      "model.init_from reads either layout back.");
  add_checkpoint_option(*cmd, a->checkpoint);
  cmd->add_option("--layout", a->layout,
                  "hf: no transformer. prefix, Conv1D weights [in, out], no lm_head; nanogpt: nn.Linear weights "
                  "[out, in], lm_head.weight a copy of wte")
      ->check(CLI::IsMember({"hf", "nanogpt"}))
      ->capture_default_str();
  cmd->add_option("--out", a->out, "the .safetensors file (written whole: OUT.tmp, then renamed)")->required();
  return {cmd, [a] {
            return run_alone([&] {
              spdlog::info("export-weights: wrote {}",
                           export_gpt_weights(a->checkpoint, models::parse_gpt_layout(a->layout), a->out));
            });
          }};
}

}  // namespace dpt::trainer::commands
