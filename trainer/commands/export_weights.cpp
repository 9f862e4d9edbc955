// trainer/commands/export_weights.cpp: `dptrain export-weights`: a GPT checkpoint's weights as safetensors other
// programs load: a folder for Hugging Face's GPT2LMHeadModel.from_pretrained (model.safetensors and config.json), or
// one file in Hugging Face's GPT-2 layout or nanoGPT's state_dict.
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
      "export-weights", "write a GPT checkpoint's weights for other programs: a folder that transformers' "
                        "GPT2LMHeadModel.from_pretrained loads (model.safetensors in Hugging Face's GPT-2 layout and "
                        "its config.json), or one safetensors file in that layout or nanoGPT's state_dict; trains "
                        "nothing");
  cmd->footer(
      "Examples:\n"
      "  dptrain export-weights --checkpoint runs/gpt_tiny/checkpoints --out gpt_tiny\n"
      "    then in Python: transformers.GPT2LMHeadModel.from_pretrained(\"gpt_tiny\")\n"
      "  dptrain export-weights --checkpoint runs/gpt_tiny/checkpoints --layout nanogpt --out gpt_tiny.safetensors\n"
      "model.init_from reads either layout back (the file, or the folder's model.safetensors).");
  add_checkpoint_option(*cmd, a->checkpoint);
  cmd->add_option("--layout", a->layout,
                  "hf: no transformer. prefix, Conv1D weights [in, out], no lm_head, and config.json in a folder; "
                  "nanogpt: nn.Linear weights [out, in], lm_head.weight a copy of wte")
      ->check(CLI::IsMember({"hf", "nanogpt"}))
      ->capture_default_str();
  cmd->add_option("--out", a->out,
                  "a folder (created if needed): OUT/model.safetensors, and OUT/config.json with --layout hf; or a "
                  "path ending in .safetensors: that one file, the weights alone. Each file is written whole "
                  "(FILE.tmp, then renamed)")
      ->required();
  return {cmd, [a] {
            return run_alone([&] {
              spdlog::info("export-weights: wrote {}",
                           export_weights(a->checkpoint, a->layout, a->out));
            });
          }};
}

}  // namespace dpt::trainer::commands
