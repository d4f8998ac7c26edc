// The two folders every part of docs_test reads: the source tree the
// documents are in and the build folder whose programs their blocks run
// (compile definitions of docs_test, tests/CMakeLists.txt).
#pragma once

#ifndef CONVEYOR_SOURCE_DIR
#error "CONVEYOR_SOURCE_DIR must name the source tree"
#endif
#ifndef CONVEYOR_BUILD_DIR
#error "CONVEYOR_BUILD_DIR must name the build folder"
#endif
