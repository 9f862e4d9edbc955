// trainer/commands/config_reference.cpp: `dptrain config-reference`: the configuration reference, every config key's
// type, default and meaning from the config schema (trainer/config.h), as Markdown on stdout; docs/configuration.md
// is its output, and a unit test fails when the committed page differs.
#include <iostream>

#include "trainer/commands/commands.h"
#include "trainer/config.h"

namespace dpt::trainer::commands {

Command add_config_reference(CLI::App& root) {
  CLI::App* cmd = root.add_subcommand(
      "config-reference", "print the configuration reference (every config key's type, default and meaning, one "
                          "Markdown table per section) to stdout, then exit; docs/configuration.md is its output");
  cmd->footer("Example: dptrain config-reference > docs/configuration.md");
  return {cmd, [] {
            std::cout << config_reference_markdown();
            return 0;
          }};
}

}  // namespace dpt::trainer::commands
