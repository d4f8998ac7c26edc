// The project's tracked text files, as git lists them: what the tree tests
// (docs_tree_test.cpp, code_shape_test.cpp) read.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace docs::tree_test {

// Calls `fn(name, text)` for each tracked text file but those under
// tests/fixtures; returns the number of files, or -1 with `*why` when git
// cannot list them.
int ForEachTrackedText(const std::function<void(const std::string&, const std::string&)>& fn, std::string* why);

// Whether the file `name` is C++ (.cpp, .h, .cc).
inline bool IsCpp(const std::string& name) {
  const std::string ext = std::filesystem::path(name).extension().string();
  return ext == ".cpp" || ext == ".h" || ext == ".cc";
}

}  // namespace docs::tree_test
