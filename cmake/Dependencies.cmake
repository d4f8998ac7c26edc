# Finds every third-party package once, for all targets.
#
# Order matters (see ../shared/gpu/README.md): Protobuf before Torch, or
# protobuf::libprotobuf ends up empty with the LibTorch of a PyTorch wheel.
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()
find_package(SQLite3 REQUIRED)
# Prometheus metrics (common/metrics.h), optional: Debian's prometheus-cpp-dev.
# Without it --metrics-listen is refused (the GPU machine's image lacks it).
find_package(prometheus-cpp CONFIG QUIET)
set(CONVEYOR_HAS_PROMETHEUS OFF)
if(TARGET prometheus-cpp::core)
  set(CONVEYOR_HAS_PROMETHEUS ON)
endif()
message(STATUS "Conveyor: Prometheus metrics ${CONVEYOR_HAS_PROMETHEUS}")
if(CONVEYOR_FUZZ)
  # The fuzz targets are torch-free.
  if(TARGET yaml-cpp::yaml-cpp)
    set(CONVEYOR_YAML yaml-cpp::yaml-cpp)
  else()
    set(CONVEYOR_YAML yaml-cpp)
  endif()
  return()
endif()
find_package(Torch REQUIRED)

# Debian's CPU-only LibTorch still ships ATen/cuda headers, so only the package
# itself can say whether it was built with CUDA.
set(CONVEYOR_HAS_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES OR CUDA_FOUND OR CUDAToolkit_FOUND)
  set(CONVEYOR_HAS_CUDA ON)
endif()
# NCCL (for the NCCL transport): with CUDA LibTorch only, from NCCL_INCLUDE_DIR
# and NCCL_LIBRARY (variables or environment; a PyTorch wheel's NCCL is a
# libnccl.so.2 without a libnccl.so link, so a full path is accepted).
set(CONVEYOR_HAS_NCCL OFF)
if(CONVEYOR_HAS_CUDA)
  if(NOT NCCL_INCLUDE_DIR AND DEFINED ENV{NCCL_INCLUDE_DIR})
    set(NCCL_INCLUDE_DIR $ENV{NCCL_INCLUDE_DIR})
  endif()
  if(NOT NCCL_LIBRARY AND DEFINED ENV{NCCL_LIBRARY})
    set(NCCL_LIBRARY $ENV{NCCL_LIBRARY})
  endif()
  find_path(NCCL_INCLUDE_DIR nccl.h)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h" AND EXISTS "${NCCL_LIBRARY}")
    set(CONVEYOR_HAS_NCCL ON)
  endif()
  find_package(CUDAToolkit QUIET)
endif()
message(STATUS "Conveyor: LibTorch ${Torch_VERSION}, CUDA ${CONVEYOR_HAS_CUDA}, NCCL ${CONVEYOR_HAS_NCCL}")

# yaml-cpp 0.7 names its target yaml-cpp; newer releases yaml-cpp::yaml-cpp.
if(TARGET yaml-cpp::yaml-cpp)
  set(CONVEYOR_YAML yaml-cpp::yaml-cpp)
else()
  set(CONVEYOR_YAML yaml-cpp)
endif()

# A PyTorch wheel ships fmt headers (newer than Debian's, which spdlog needs)
# and an old protobuf in the same include folder. LibTorch's headers need the
# wheel's fmt, the generated gRPC code needs Debian's protobuf: a folder with
# just the wheel's fmt goes first on the include path, LibTorch's own last.
set(CONVEYOR_TORCH_FMT_DIR "")
foreach(dir ${TORCH_INCLUDE_DIRS})
  if(EXISTS "${dir}/fmt/format.h" AND NOT CONVEYOR_TORCH_FMT_DIR)
    set(CONVEYOR_TORCH_FMT_DIR ${CMAKE_BINARY_DIR}/torch-fmt)
    file(MAKE_DIRECTORY ${CONVEYOR_TORCH_FMT_DIR})
    file(CREATE_LINK "${dir}/fmt" "${CONVEYOR_TORCH_FMT_DIR}/fmt" SYMBOLIC)
    message(STATUS "Conveyor: LibTorch's fmt from ${dir}")
  endif()
endforeach()

# LibTorch 2.7 and later can size matmuls to leave SMs to a communication
# kernel running beside them (Context::_setSMCarveout_EXPERIMENTAL).
set(CONVEYOR_HAS_SM_CARVEOUT OFF)
foreach(dir ${TORCH_INCLUDE_DIRS})
  if(EXISTS "${dir}/ATen/Context.h")
    file(STRINGS "${dir}/ATen/Context.h" carveout REGEX "_setSMCarveout_EXPERIMENTAL")
    if(carveout)
      set(CONVEYOR_HAS_SM_CARVEOUT ON)
    endif()
  endif()
endforeach()
message(STATUS "Conveyor: matmul SM carveout ${CONVEYOR_HAS_SM_CARVEOUT}")

# LibTorch's imported flags (e.g. -D_GLIBCXX_USE_CXX11_ABI) reach every target
# that links it through TORCH_LIBRARIES; TORCH_CXX_FLAGS carries the rest.
set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} ${TORCH_CXX_FLAGS}")

# Links LibTorch into `target` (a library that includes its headers): last, so
# that Protobuf's headers are found before the wheel's older copy; the wheel's
# fmt first on the include path; the carveout macro alike in every target that
# reuses conveyor_model's precompiled header. Call it after the target's other
# target_link_libraries.
function(conveyor_link_torch target)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  if(CONVEYOR_HAS_SM_CARVEOUT)
    target_compile_definitions(${target} PUBLIC CONVEYOR_HAS_SM_CARVEOUT=1)
  endif()
  if(CONVEYOR_TORCH_FMT_DIR)
    target_include_directories(${target} BEFORE PUBLIC ${CONVEYOR_TORCH_FMT_DIR})
  endif()
endfunction()

# Compiles `target`'s sources, most of which include much of LibTorch: BATCH of
# them to a compiler run (a unity build: parsing LibTorch's headers, about 15 s
# a run on a 2-core machine, is most of such a file's time), with the
# precompiled header (conveyor_model's) where CONVEYOR_USE_PCH. The LIGHT
# sources, which include little of LibTorch, go alone and without the header:
# loading its 500 MB costs a run 5 s or more.
function(conveyor_compile_torch_sources target)
  cmake_parse_arguments(arg "" "BATCH" "LIGHT" ${ARGN})
  if(arg_LIGHT)
    set_source_files_properties(${arg_LIGHT} PROPERTIES SKIP_PRECOMPILE_HEADERS ON SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
  if(CONVEYOR_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${arg_BATCH})
    # The CUDA-only sources (*_cuda.cpp, built on GPU machines alone) go
    # alone: a unity batch is then the same files on every machine.
    get_target_property(sources ${target} SOURCES)
    list(FILTER sources INCLUDE REGEX "_cuda\\.cpp$")
    if(sources)
      set_source_files_properties(${sources} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
    endif()
  endif()
  if(CONVEYOR_USE_PCH)
    if(target STREQUAL conveyor_model)
      target_precompile_headers(conveyor_model PRIVATE torch_pch.h)
    else()
      target_precompile_headers(${target} REUSE_FROM conveyor_model)
    endif()
  endif()
endfunction()

# The libraries that do not include LibTorch compile BATCH files to a compiler
# run too where CONVEYOR_UNITY: each of their files parses gRPC's and
# Protobuf's headers (conveyor.pb.h alone is some 40,000 lines).
function(conveyor_unity target batch)
  if(CONVEYOR_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch})
  endif()
endfunction()
