// conveyor-torch: the command-line client linked with LibTorch, for the
// commands that need it (cli/torch_binary.h); `conveyor` runs it for them.
#include "cli/commands.h"
#include "common/server.h"

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  conveyor::InstallCrashHandler("conveyor-torch");
  const int rc = conveyor::cli::Main(argc, argv, conveyor::cli::RunReference, conveyor::cli::ExportCheckpoints);
  // Everything is done and written: leave without running static destructors.
  // With a PyTorch wheel's LibTorch beside Debian's gRPC and protobuf, those
  // crashed the process after its work (exit 139 on the GPU machine).
  std::fflush(nullptr);
  std::_Exit(rc);
}
