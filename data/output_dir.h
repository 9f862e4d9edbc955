// data/output_dir.h: OutputDir, the directory a data-writing command fills (dptrain export-images, dptrain
// tokenize): refused when it already holds something unless forced, written whole under OUT.tmp and renamed
// into place only when complete, so OUT is either the old contents or the new ones, never half of each.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace dpt::data {

// True when `p` is a directory with at least one entry.
bool non_empty_directory(const std::filesystem::path& p);

// How a command reads a folder given to it as an input, for check_output_apart.
enum class FolderRead {
  every_file,   // every file in it, recursively (tokenize's text): an OUT inside it would be read by a later run
  named_files,  // only files of a known name or kind (*.jsonl, Fashion-MNIST's IDX files): an OUT inside it is not
};

// Where an output directory and a command's inputs may not meet (ConfigError, nothing touched): OUT equal to an
// input, or holding one (a forced replacement of OUT would delete it), the same for OUT.tmp and OUT.old beside it
// (cleared and removed while writing); and, with FolderRead::every_file, OUT inside an input folder (a later run
// would read this one's shards and tokenizer files as text). Paths are compared resolved (absolute, symlinks
// followed, "." and ".." taken out), so `ctext`, `./ctext/` and `/abs/ctext` meet. `out_name` and `input_name` say
// what the two are in the message ("--out", "--input"; "data.dir", "data.jsonl").
void check_output_apart(const std::string& out, const std::vector<std::string>& inputs, FolderRead read,
                        const std::string& out_name = "--out", const std::string& input_name = "--input");

class OutputDir {
 public:
  // `dir` normalised ("out/" is "out"). ConfigError when it exists and is not a directory, is a non-empty
  // directory and `force` is false, or meets `inputs` (check_output_apart, named so, before anything is touched).
  // Creates the parent and a fresh, empty OUT.tmp (removing one an interrupted run left).
  OutputDir(const std::string& dir, bool force, const std::vector<std::string>& inputs, FolderRead read,
            const std::string& out_name = "--out", const std::string& input_name = "--input");
  // Removes OUT.tmp unless commit() ran.
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::filesystem::path& path() const { return out_; }   // OUT, where it all ends up
  const std::filesystem::path& staging() const { return tmp_; }  // OUT.tmp, where it is written
  // OUT.tmp becomes OUT; an existing OUT (empty, or replaced by force) is renamed aside first (to OUT.old,
  // replacing one an interrupted run left), then removed.
  void commit();

 private:
  std::filesystem::path out_, tmp_;
  bool committed_ = false;
};

}  // namespace dpt::data
