// conveyor: the command-line client.
#include "cli/commands.h"

int main(int argc, char** argv) { return conveyor::cli::Main(argc, argv); }
