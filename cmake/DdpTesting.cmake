# ddp_unit_test(NAME SOURCES... LIBS ...): one GoogleTest binary, registered per test case, label "unit".
# XDG_STATE_HOME: ended jobs' records (lib/control/paths.hpp) stay in the build, not in $HOME.
function(ddp_unit_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  include(GoogleTest)
  gtest_discover_tests(${name} PROPERTIES LABELS unit
    ENVIRONMENT "DDP_SOURCE_DIR=${CMAKE_SOURCE_DIR};DDP_BINARY_DIR=${CMAKE_BINARY_DIR};XDG_STATE_HOME=${CMAKE_BINARY_DIR}/test-state"
    DISCOVERY_TIMEOUT 30)
endfunction()

# ddp_tsan_test(NAME SOURCES... LIBS ...): a unit test of threads that run for real (the store's I/O
# threads, the terminal writer), one ctest entry per binary, labels "unit" and "tsan". scripts/test
# builds only these in build-tsan (-DDDP_SANITIZE=thread) and runs them there; elsewhere they are
# ordinary unit tests.
function(ddp_tsan_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "unit;tsan" TIMEOUT 300
    ENVIRONMENT "DDP_SOURCE_DIR=${CMAKE_SOURCE_DIR};DDP_BINARY_DIR=${CMAKE_BINARY_DIR};XDG_STATE_HOME=${CMAKE_BINARY_DIR}/test-state")
  set_property(GLOBAL APPEND PROPERTY DDP_TSAN_TARGETS ${name})
endfunction()
