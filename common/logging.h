// Logging for all of Conveyor.
//
// A thin layer over spdlog whose header includes neither spdlog nor fmt, so
// LibTorch code may log without compiling two fmt versions together (the torch
// wheel ships fmt 12, Debian's spdlog wants fmt 9). Messages are built with
// StrCat from anything that has an operator<<.
//
// Thread-safe. Lines carry job, stage, step and micro-batch ids in their text.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace conveyor {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// Parses "trace|debug|info|warn|error|off"; returns false for anything else.
bool ParseLogLevel(std::string_view name, LogLevel* level);
void SetLogLevel(LogLevel level);
// Names the process in every line (e.g. "stage-2", "coordinator").
void SetLogName(const std::string& name);
bool LogEnabled(LogLevel level);
// ParseLogLevel + SetLogLevel + SetLogName; on an unknown level prints the
// problem to stderr and returns false (a program then exits with 2).
bool ConfigureLogging(const std::string& level, const std::string& name);
void LogWrite(LogLevel level, std::string_view message);

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace conveyor

#define CONVEYOR_LOG(level, ...)                                      \
  do {                                                                \
    if (::conveyor::LogEnabled(::conveyor::LogLevel::level))          \
      ::conveyor::LogWrite(::conveyor::LogLevel::level,               \
                           ::conveyor::StrCat(__VA_ARGS__));          \
  } while (0)

#define LOG_DEBUG(...) CONVEYOR_LOG(kDebug, __VA_ARGS__)
#define LOG_INFO(...) CONVEYOR_LOG(kInfo, __VA_ARGS__)
#define LOG_WARN(...) CONVEYOR_LOG(kWarn, __VA_ARGS__)
#define LOG_ERROR(...) CONVEYOR_LOG(kError, __VA_ARGS__)
