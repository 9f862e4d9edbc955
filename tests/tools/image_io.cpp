// tests/tools/image_io.cpp: dpt-image-io, data/image_io.h from the command line, for integration.image_decode's
// comparisons with PIL:
//   dpt-image-io decode IN CHANNELS OUT.png    IN decoded as the data sets decode it (read_image, 1 or 3 channels),
//                                              written losslessly as an 8-bit PNG
//   dpt-image-io ycck RAW H W QUALITY OUT.jpg  RAW's H x W x 4 bytes (CMYK samples as a JPEG stores them) written as a
//                                              YCCK JPEG (libjpeg's JCS_YCCK, an Adobe marker with transform 2), the
//                                              kind Photoshop writes and PIL cannot
// On an error: the message on stderr, exit 1 (2 for bad arguments).
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

// clang-format off
#include <jpeglib.h>
// clang-format on

#include "data/image_io.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: dpt-image-io decode IN CHANNELS OUT.png | dpt-image-io ycck RAW H W QUALITY OUT.jpg\n");
  return 2;
}

// libjpeg's default error handler exits the process, which is all a test tool needs.
void write_ycck(const std::vector<unsigned char>& samples, int height, int width, int quality, const std::string& out) {
  FILE* f = std::fopen(out.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error(out + ": cannot open for writing");
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_set_colorspace(&cinfo, JCS_YCCK);  // libjpeg writes the Adobe marker (transform 2) for it
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    auto* row = const_cast<unsigned char*>(samples.data()) + static_cast<size_t>(cinfo.next_scanline) * width * 4;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  if (std::fclose(f) != 0) throw std::runtime_error(out + ": write failed");
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 4 && args[0] == "decode") {
      const dpt::data::Image image = dpt::data::read_image(args[1], std::stoi(args[2]));
      dpt::data::write_png(args[3], image.view());
      std::printf("%lldx%lldx%lld\n", static_cast<long long>(image.height), static_cast<long long>(image.width),
                  static_cast<long long>(image.channels));
      return 0;
    }
    if (args.size() == 6 && args[0] == "ycck") {
      std::ifstream in(args[1], std::ios::binary);
      const std::vector<unsigned char> samples((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const int height = std::stoi(args[2]), width = std::stoi(args[3]);
      if (!in || samples.size() != static_cast<size_t>(height) * width * 4)
        throw std::runtime_error(args[1] + ": not " + args[2] + " x " + args[3] + " x 4 bytes");
      write_ycck(samples, height, width, std::stoi(args[4]), args[5]);
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return usage();
}
