// data/output_dir.h: OutputDir, the directory a data-writing command fills (dptrain export-images, dptrain
// tokenize): refused when it already holds something unless forced, written whole under OUT.tmp and renamed
// into place only when complete, so OUT is either the old contents or the new ones, never half of each.
#pragma once

#include <filesystem>
#include <string>

namespace dpt::data {

// True when `p` is a directory with at least one entry.
bool non_empty_directory(const std::filesystem::path& p);

class OutputDir {
 public:
  // `dir` normalised ("out/" is "out"). IoError when it exists and is not a directory, or is a non-empty
  // directory and `force` is false. Creates the parent and a fresh, empty OUT.tmp (removing one an
  // interrupted run left).
  OutputDir(const std::string& dir, bool force);
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
