// tests/support/log_capture.h: what spdlog's default logger writes while a LogCapture is alive, for tests that
// check a warning was (or was not) given.
#pragma once

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace dpt::test {

struct LogCapture {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  LogCapture() { spdlog::default_logger()->sinks().push_back(sink); }
  ~LogCapture() { spdlog::default_logger()->sinks().pop_back(); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  // How many captured lines contain `text`.
  size_t count(const std::string& text) const {
    size_t n = 0;
    for (const std::string& line : sink->last_formatted()) n += line.find(text) != std::string::npos ? 1 : 0;
    return n;
  }
};

}  // namespace dpt::test
