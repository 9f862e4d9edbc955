// trainer/commands/export_weights.cpp: `dptrain export-weights`: a GPT's or a Llama's checkpoint weights as safetensors
// other programs load: a folder for Hugging Face's from_pretrained (model.safetensors or its shards, and config.json),
// or one file in Hugging Face's layout or (a GPT) nanoGPT's state_dict.
#include <spdlog/spdlog.h>

#include <cctype>
#include <cmath>
#include <map>

#include "trainer/build_model.h"
#include "trainer/commands/commands.h"
#include "trainer/gpt_checkpoint.h"

namespace dpt::trainer::commands {
namespace {

struct ExportWeightsArgs {
  std::string checkpoint, layout = "hf", out, max_shard_size = "5GB";
};

// A size as save_pretrained's max_shard_size reads it (transformers' convert_file_size_to_int): a byte count, or a
// number with a unit in any case: decimal KB, MB, GB (10^3, 10^6, 10^9 bytes), binary KiB, MiB, GiB (2^10, 2^20,
// 2^30); a decimal unit ending in a lower-case b counts bits ("8Mb": 1 MB). ConfigError otherwise.
uint64_t parse_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  std::string upper = unit;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::map<std::string, double> scales = {{"", 1.0},       {"B", 1.0},          {"KB", 1e3},
                                                {"MB", 1e6},     {"GB", 1e9},         {"KIB", 1024.0},
                                                {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  const auto it = scales.find(upper);
  double scale = it == scales.end() ? 0.0 : it->second;
  if (upper.size() == 2 && upper != "B" && unit.back() == 'b') scale /= 8;  // "Mb": megabits
  if (used == 0 || scale == 0.0 || !std::isfinite(value) || !(value * scale >= 1.0) || value * scale > 1e18)
    DPT_THROW(ConfigError, "--max-shard-size {}: a size such as 5GB, 500MB, 64KB (decimal), 4GiB, 512MiB, 64KiB "
              "(binary) or a byte count (at most 1e18)", text);
  return static_cast<uint64_t>(value * scale);
}

}  // namespace

Command add_export_weights(CLI::App& root) {
  auto a = std::make_shared<ExportWeightsArgs>();
  CLI::App* cmd = root.add_subcommand(
      "export-weights", "write a GPT's or a Llama's checkpoint weights for other programs: a folder that transformers' "
                        "from_pretrained loads (GPT2LMHeadModel, LlamaForCausalLM or Qwen2ForCausalLM: "
                        "model.safetensors, or shards and their index, and config.json), or one safetensors file in "
                        "that layout or (a GPT) nanoGPT's state_dict; trains nothing");
  cmd->footer(
      "Examples:\n"
      "  dptrain export-weights --checkpoint runs/gpt_tiny/checkpoints --out gpt_tiny\n"
      "    then in Python: transformers.GPT2LMHeadModel.from_pretrained(\"gpt_tiny\")\n"
      "  dptrain export-weights --checkpoint runs/gpt_tiny/checkpoints --layout nanogpt --out gpt_tiny.safetensors\n"
      "  dptrain export-weights --checkpoint runs/llama_tiny/checkpoints --out llama_tiny\n"
      "    then in Python: transformers.AutoModelForCausalLM.from_pretrained(\"llama_tiny\")\n"
      "model.init_from reads every layout back (the file, or the folder).");
  add_checkpoint_option(*cmd, a->checkpoint);
  cmd->add_option("--layout", a->layout,
                  "hf: Hugging Face's names and shapes, and config.json in a folder (a GPT: no transformer. prefix, "
                  "Conv1D weights [in, out], no lm_head; a llama: LlamaForCausalLM's, lm_head.weight unless tied); "
                  "nanogpt (a GPT only): nn.Linear weights [out, in], lm_head.weight a copy of wte")
      ->check(CLI::IsMember({"hf", "nanogpt"}))
      ->capture_default_str();
  cmd->add_option("--out", a->out,
                  "a folder (created if needed): OUT/model.safetensors, and OUT/config.json with --layout hf; or a "
                  "path ending in .safetensors: that one file, the weights alone. Each file is written whole "
                  "(FILE.tmp, then renamed); into a folder holding an earlier export, its config.json goes before "
                  "any weights change and the new one comes last, so an export stopped midway leaves no config.json "
                  "(refused by from_pretrained), never new weights under an earlier model's config. A name ending in "
                  ".pth, .pt, .bin or .ckpt (PyTorch's formats, which this does not write) is refused")
      ->required()
      ->check(CLI::Validator(
          [](std::string& out) -> std::string {
            const std::string_view name = std::string_view(out).substr(out.find_last_of('/') + 1);
            for (std::string_view ext : {".pth", ".pt", ".bin", ".ckpt"})
              if (name.size() > ext.size() && name.ends_with(ext))
                return fmt::format("{} names a PyTorch file, but export-weights writes safetensors only: a folder "
                                   "(for from_pretrained) or a path ending in .safetensors (for "
                                   "safetensors.torch.load_file)", out);
            return "";
          },
          "", "not .pth/.pt/.bin/.ckpt"));
  cmd->add_option("--max-shard-size", a->max_shard_size,
                  "in a folder, weights larger than this go into shards model-0000I-of-0000N.safetensors with "
                  "model.safetensors.index.json, as save_pretrained's max_shard_size (decimal KB, MB, GB; binary KiB, "
                  "MiB, GiB)")
      ->capture_default_str();
  return {cmd, [a] {
            return run_alone([&] {
              spdlog::info("export-weights: wrote {}",
                           export_weights(a->checkpoint, a->layout, a->out, parse_size(a->max_shard_size)));
            });
          }};
}

}  // namespace dpt::trainer::commands
