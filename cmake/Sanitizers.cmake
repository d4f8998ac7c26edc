# CONVEYOR_SANITIZE=asan|tsan: the whole build instrumented, in a build folder
# of its own (scripts/build.sh --sanitize: build-asan, build-tsan). Only the
# project's code is instrumented: LibTorch, OpenMP, gRPC and protobuf are
# Debian's builds; tests/sanitizers/*.supp name what of theirs is suppressed
# and why (docs/testing.md, "Sanitizers").
if(NOT CONVEYOR_SANITIZE)
  return()
endif()
if(CONVEYOR_SANITIZE STREQUAL "asan")
  # Every undefined behaviour fails the test (no recover): a report that only
  # prints is a report nobody reads.
  set(CONVEYOR_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined)
elseif(CONVEYOR_SANITIZE STREQUAL "tsan")
  set(CONVEYOR_SANITIZER_FLAGS -fsanitize=thread)
else()
  message(FATAL_ERROR "CONVEYOR_SANITIZE=${CONVEYOR_SANITIZE}: use asan (address and undefined) or tsan (thread)")
endif()
add_compile_options(${CONVEYOR_SANITIZER_FLAGS} -fno-omit-frame-pointer)
add_link_options(${CONVEYOR_SANITIZER_FLAGS})
message(STATUS "Conveyor: sanitizers ${CONVEYOR_SANITIZER_FLAGS}")
