// Fixtures for tests/model: PyTorch writes them at test time through
// tests/model/torch_files.py, under $CONVEYOR_PYTHON, python3 or
// /usr/bin/python3 (the first that can `import torch`); tests skip where none
// can. Header-only, shared by torch_file_test and state_dict_test.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#ifndef CONVEYOR_SOURCE_DIR
#error "CONVEYOR_SOURCE_DIR (the repository root) must be defined"
#endif

namespace conveyor {
namespace testing_fixtures {

inline std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

inline std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// A literal with its NULs.
template <std::size_t N>
std::string B(const char (&s)[N]) {
  return std::string(s, N - 1);
}

inline std::string Ints(const std::vector<int64_t>& v) {
  std::string out;
  for (std::size_t n = 0; n < v.size(); ++n) out += (n ? "," : "") + std::to_string(v[n]);
  return out;
}

// One line of an EXPECT file (see torch_files.py).
struct Expected {
  std::string name, dtype, shape, stride, offset, group, hex;
};

inline std::vector<Expected> ReadExpect(const std::string& path) {
  std::vector<Expected> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string field;
    while (std::getline(ss, field, '\t')) f.push_back(field);
    while (f.size() < 7) f.push_back("");
    out.push_back({f[0], f[1], f[2], f[3], f[4], f[5], f[6]});
  }
  return out;
}

inline void WriteExpectLine(std::ostream& out, const std::string& name, const std::string& dtype,
                            const std::vector<int64_t>& shape, const std::string& bytes) {
  out << name << "\t" << dtype << "\t" << Ints(shape) << "\t\t0\t" << name << "\t" << Hex(bytes) << "\n";
}

// PyTorch, the script and a scratch folder with the fixtures, shared by a
// suite: sd.pt (+ sd.txt, sd.pt.data.pkl), td.pt (+ td.txt), evil.pt (its
// payload would create PWNED), legacy.pt.
class TorchFixtureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = ::testing::TempDir() + "/torch_fixtures.XXXXXX";
    dir_ = new std::string(::mkdtemp(tmpl.data()));
    python_ = new std::string;
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("CONVEYOR_PYTHON"); env && *env) candidates.push_back(env);
    candidates.push_back("python3");
    candidates.push_back("/usr/bin/python3");
    // One run of the script per candidate writes every fixture (importing
    // torch costs about a second; a python without it fails at once).
    for (const auto& py : candidates) {
      *python_ = py;
      if (Py("fixtures " + Quote(*dir_)) == 0) return;
    }
    std::fprintf(stderr, "no python3 here wrote the fixtures with torch_files.py; the last one said:\n%s\n",
                 PyLog().c_str());
    python_->clear();
  }
  static void TearDownTestSuite() {
    if (std::system(("rm -rf " + Quote(*dir_)).c_str()) != 0) std::fprintf(stderr, "cannot remove %s\n", dir_->c_str());
    delete dir_;
    delete python_;
  }
  void SetUp() override {
    if (python_->empty()) GTEST_SKIP() << "no python3 that can `import torch` (set CONVEYOR_PYTHON) to write fixtures";
  }

  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }
  // torch_files.py ARGS; its output goes to PyLog().
  static int Py(const std::string& args) {
    return std::system((Quote(*python_) + " " + Quote(std::string(CONVEYOR_SOURCE_DIR) + "/tests/model/torch_files.py") +
                        " " + args + " >" + Quote(Path("py.log")) + " 2>&1")
                           .c_str());
  }
  static std::string PyLog() { return Slurp(Path("py.log")); }

  static inline std::string* dir_ = nullptr;
  static inline std::string* python_ = nullptr;
};

}  // namespace testing_fixtures
}  // namespace conveyor
