#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>

namespace conveyor {
namespace {

spdlog::level::level_enum ToSpd(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::info;
}

// Logs go to stderr: stdout is kept for machine-readable output (--json).
std::shared_ptr<spdlog::logger> Logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("conveyor");
    l->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ [%n] %v");
    l->set_level(spdlog::level::info);
    return l;
  }();
  return logger;
}

}  // namespace

bool ParseLogLevel(std::string_view name, LogLevel* level) {
  static const std::pair<std::string_view, LogLevel> kNames[] = {
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug},
      {"info", LogLevel::kInfo},   {"warn", LogLevel::kWarn},
      {"error", LogLevel::kError}, {"off", LogLevel::kOff}};
  for (const auto& [n, l] : kNames) {
    if (n == name) {
      *level = l;
      return true;
    }
  }
  return false;
}

void SetLogLevel(LogLevel level) { Logger()->set_level(ToSpd(level)); }

void SetLogName(const std::string& name) {
  Logger()->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ [" + name + "] %v");
}

bool ConfigureLogging(const std::string& level_name, const std::string& name) {
  LogLevel level;
  if (!ParseLogLevel(level_name, &level)) {
    std::fprintf(stderr, "%s: unknown log level '%s' (trace, debug, info, warn, error, off)\n", name.c_str(),
                 level_name.c_str());
    return false;
  }
  SetLogLevel(level);
  SetLogName(name);
  return true;
}

bool LogEnabled(LogLevel level) { return Logger()->should_log(ToSpd(level)); }

void LogWrite(LogLevel level, std::string_view message) {
  Logger()->log(ToSpd(level), "{}", message);
}

}  // namespace conveyor
