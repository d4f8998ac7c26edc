// tests/support/test_util.h's temporary folders, for the torch-free test
// executable (test_util.cpp itself calls LibTorch): the same two definitions.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/files.h"
#include "tests/support/test_util.h"

namespace conveyor::testing {

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = ::testing::TempDir() + "/" + prefix + "-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr) << tmpl;
  return tmpl;
}

ScopedTempDir::~ScopedTempDir() { RemoveTree(path_); }

}  // namespace conveyor::testing
