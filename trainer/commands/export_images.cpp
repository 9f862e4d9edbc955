// trainer/commands/export_images.cpp: `dptrain export-images`: Fashion-MNIST as OUT/{train,val}/<class>/<index>.png,
// torchvision's ImageFolder layout, for the image-folder path; trains nothing.
#include <spdlog/spdlog.h>

#include <chrono>

#include "data/export.h"
#include "data/idx.h"
#include "trainer/commands/commands.h"

namespace dpt::trainer::commands {
namespace {

struct ExportImagesArgs {
  std::string out;
  std::string data_dir = data::kFashionMnistDir;
  std::string format = "png";
  size_t limit = 0;
  bool force = false;
};

int export_images(const ExportImagesArgs& a) {
  return run_writer("export-images", a.out, a.force, {a.data_dir}, "--data-dir", [&] {
    const auto start = std::chrono::steady_clock::now();
    auto train = data::load_fashion_mnist(a.data_dir, true);
    auto test = data::load_fashion_mnist(a.data_dir, false);
    data::ExportOptions o;
    o.out_dir = a.out;
    o.format = a.format == "png" ? data::ImageFormat::png : data::ImageFormat::jpeg;
    o.limit = a.limit;
    o.force = a.force;
    o.source_dir = a.data_dir;
    o.class_names = data::fashion_mnist_class_folders();
    o.progress = [](const std::string& split, size_t done, size_t total) {
      spdlog::info("export-images: {} {}/{} images", split, done, total);
    };
    const data::ExportSummary s = data::export_image_folder(*train, *test, o);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string size =
        s.bytes < 1000000 ? fmt::format("{:.1f} kB", s.bytes / 1e3) : fmt::format("{:.1f} MB", s.bytes / 1e6);
    spdlog::info("export-images: wrote {} train + {} val {} images of {} classes ({}) to {} in {:.1f} s",
                 s.train_images, s.val_images, a.format == "png" ? "PNG" : "JPEG", s.classes, size, s.out_dir, seconds);
  });
}

}  // namespace

Command add_export_images(CLI::App& root) {
  auto a = std::make_shared<ExportImagesArgs>();
  CLI::App* cmd = root.add_subcommand(
      "export-images",
      "write Fashion-MNIST as an image folder in torchvision's ImageFolder layout (OUT/train/<class>/<index>.png "
      "and OUT/val/..., class folders 0_tshirt_top ... 9_ankle_boot, grey 28x28), then exit; trains nothing");
  cmd->footer("Example: dptrain export-images --out /tmp/fmnist-images --limit 1000");
  add_out_dir_option(*cmd, a->out);
  cmd->add_option("--data-dir", a->data_dir, "directory of the Fashion-MNIST IDX .gz files")->capture_default_str();
  cmd->add_option("--format", a->format, "png (lossless: reads back identical) | jpg (quality 95)")
      ->check(CLI::IsMember({"png", "jpg"}))
      ->capture_default_str();
  cmd->add_option("--limit", a->limit,
                  "images per split, spread evenly over the 10 classes (0: all 60000 + 10000; else >= 10)")
      ->check(whole_number())
      ->capture_default_str();
  add_force_flag(*cmd, a->force);
  return {cmd, [a] { return export_images(*a); }};
}

}  // namespace dpt::trainer::commands
