# ctest tests one per GoogleTest suite, not one per test (tests/CMakeLists.txt,
# conveyor_test(... SUITES)): run after the build as a script,
#   cmake -D TEST_EXECUTABLE=BIN -D CTEST_FILE=OUT -D PROPERTIES_FILE=PROPS
#         -D WORKING_DIR=DIR -D RUNNER=tests/support/run_suite.sh [-D FILTER=-SUITE.*]
#         -P TestSuites.cmake
# it reads BIN --gtest_list_tests and writes OUT, which ctest includes: a test
# named "SUITE.*" running RUNNER BIN SUITE.* for each suite, with the
# properties PROPS sets (suite_properties, a list). Each test process pays
# LibTorch's start (0.74 s of CPU on the 2-core machine), so a suite of short
# tests run in one process saves that per test. RUNNER exits 77 (skipped)
# where every test of the suite skipped. FILTER leaves one suite out.
execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
                OUTPUT_VARIABLE listing RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed (${rc}): ${err}")
endif()
include("${PROPERTIES_FILE}")
set(properties "")
foreach(p IN LISTS suite_properties)
  string(APPEND properties " [==[${p}]==]")
endforeach()
string(REPLACE "\n" ";" lines "${listing}")
set(content "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.")  # "Suite." (then "  # TypeParam = ..." for typed suites)
    set(name "${CMAKE_MATCH_1}.*")
    if("-${name}" STREQUAL "${FILTER}")
      continue()
    endif()
    string(APPEND content
           "add_test([==[${name}]==] \"${RUNNER}\" \"${TEST_EXECUTABLE}\" [==[${name}]==])\n"
           "set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY \"${WORKING_DIR}\""
           " SKIP_RETURN_CODE 77${properties})\n")
  endif()
endforeach()
file(WRITE "${CTEST_FILE}" "${content}")
