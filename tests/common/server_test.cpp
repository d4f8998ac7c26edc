#include "common/server.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace conveyor {
namespace {

// A server writing to a peer that is gone (a killed replica's socket) gets
// EPIPE, not SIGPIPE's death. In a child, since it changes the process's
// signal dispositions.
TEST(ServerProcess, AWriteToAClosedPeerFailsInsteadOfKillingTheProcess) {
  EXPECT_EXIT(
      {
        InstallCrashHandler("server_test");
        int fds[2];
        if (pipe(fds) != 0) std::_Exit(2);
        close(fds[0]);
        const char byte = 1;
        const bool epipe = write(fds[1], &byte, 1) == -1 && errno == EPIPE;
        std::_Exit(epipe ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace conveyor
