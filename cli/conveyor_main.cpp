// conveyor: the command-line client, without LibTorch: `train --reference`
// and `export --checkpoint-dir` run in conveyor-torch (cli/torch_binary.h).
#include "cli/commands.h"
#include "cli/torch_binary.h"
#include "common/server.h"

int main(int argc, char** argv) {
  conveyor::InstallCrashHandler("conveyor");
  return conveyor::cli::Main(argc, argv, conveyor::cli::TrainInTorchBinary(argv),
                             conveyor::cli::ExportInTorchBinary(argv));
}
