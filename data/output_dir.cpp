// data/output_dir.cpp: see output_dir.h.
#include "data/output_dir.h"

#include <system_error>

#include "core/check.h"

namespace dpt::data {

namespace fs = std::filesystem;

bool non_empty_directory(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && !fs::is_empty(p, ec);
}

namespace {

// `p` absolute, its symlinks followed as far as it exists, "." and ".." taken out, no trailing separator.
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) r = fs::absolute(p, ec).lexically_normal();
  if (r.filename().empty() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
  return r;
}

// Whether `inner` is `outer` or lies inside it (both resolved).
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

}  // namespace

void check_output_apart(const std::string& out, const std::vector<std::string>& inputs, FolderRead read,
                        const std::string& out_name, const std::string& input_name) {
  fs::path o = fs::path(out).lexically_normal();
  if (o.filename().empty()) o = o.parent_path();
  const fs::path res = resolved(o);
  const std::string staged = o.string() + ".tmp", aside = o.string() + ".old";
  for (const std::string& input : inputs) {
    const fs::path in = resolved(input);
    for (const std::string& place : {o.string(), staged, aside}) {
      const fs::path p = resolved(place);
      if (!within(in, p)) continue;
      const std::string where = place == o.string() ? out_name + " " + out : fmt::format("{} (beside {} {})", place,
                                                                                          out_name, out);
      DPT_THROW(ConfigError, "{} {} the {} {}: writing there would delete it; give {} a path that is no input and "
                "holds none (nothing was touched)", where, in == p ? "is" : "holds", input_name, input, out_name);
    }
    std::error_code ec;
    if (read == FolderRead::every_file && fs::is_directory(in, ec) && within(res, in))
      DPT_THROW(ConfigError, "{} {} lies inside the {} folder {}, every file of which is read: a later run would read "
                "this one's output as input; give {} a folder outside {} (or give the files themselves as {}; nothing "
                "was touched)", out_name, out, input_name, input, out_name, input, input_name);
  }
}

OutputDir::OutputDir(const std::string& dir, bool force, const std::vector<std::string>& inputs, FolderRead read,
                     const std::string& out_name, const std::string& input_name) {
  check_output_apart(dir, inputs, read, out_name, input_name);
  out_ = fs::path(dir).lexically_normal();
  if (out_.filename().empty()) out_ = out_.parent_path();  // "dir/" -> "dir"
  std::error_code ec;
  if (fs::exists(out_, ec) && !fs::is_directory(out_, ec))
    DPT_THROW(ConfigError, "{}: exists and is not a directory", out_.string());
  if (non_empty_directory(out_) && !force)
    DPT_THROW(ConfigError, "{}: not empty: refusing to overwrite it (force replaces it)", out_.string());
  tmp_ = out_.string() + ".tmp";
  try {
    if (!out_.parent_path().empty()) fs::create_directories(out_.parent_path());
    fs::remove_all(tmp_);  // left by an interrupted run
    fs::create_directories(tmp_);
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "{}: {}", tmp_.string(), e.what());
  }
}

OutputDir::~OutputDir() {
  std::error_code ec;
  if (!committed_) fs::remove_all(tmp_, ec);
}

void OutputDir::commit() {
  try {
    if (fs::exists(out_)) {
      const fs::path old = out_.string() + ".old";
      fs::remove_all(old);
      fs::rename(out_, old);
      fs::rename(tmp_, out_);
      fs::remove_all(old);
    } else {
      fs::rename(tmp_, out_);
    }
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "moving {} into place: {}", tmp_.string(), e.what());
  }
  committed_ = true;
}

}  // namespace dpt::data
