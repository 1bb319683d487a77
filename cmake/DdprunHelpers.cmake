# Shared CMake helpers: warnings, unit tests and Python integration tests.

# Python interpreters the tests drive (overridable on the cmake command line).
set(DDPRUN_TORCH1_PYTHON "/usr/bin/python3" CACHE FILEPATH "Python with Debian's torch 1.13")
set(DDPRUN_TORCH2_VENV "$ENV{HOME}/.cache/ddprun/torch2-venv" CACHE PATH "virtualenv with torch 2.x")
set(DDPRUN_TORCH2_PYTHON "${DDPRUN_TORCH2_VENV}/bin/python" CACHE FILEPATH "Python with torch 2.x")
# Where ddprun/ddpstore live; the second (SDK-only) build points this at the main build's bin/.
set(DDPRUN_LAUNCHER_BIN_DIR "${CMAKE_BINARY_DIR}/bin" CACHE PATH "Directory holding ddprun and ddpstore")

# -Wmissing-field-initializers: the flag table (launcher/flags.cpp) names only the fields a row
# sets, by designated initializers; the rest have defaults. -Wrestrict: GCC 12 reports
# impossible overlaps inside libstdc++'s string appends at -O2 (a false positive of GCC's).
function(ddprun_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter
    -Wno-missing-field-initializers
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>)
endfunction()

# ddprun_add_gtest(NAME SOURCES a_test.cpp ... LIBS lib ... [LABELS l ...])
function(ddprun_add_gtest name)
  if(NOT DDPRUN_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest_main GTest::gmock)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  ddprun_warnings(${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "unit;${ARG_LABELS}" TIMEOUT 300)
endfunction()

# ddprun_add_pytest(NAME tests/foo/test_bar.py [LABELS l ...] [TIMEOUT s])
# Runs one pytest file with Debian's /usr/bin/python3; the environment tells the test where
# the build's binaries and the two Python generations are (see tests/conftest.py).
function(ddprun_add_pytest name file)
  if(NOT DDPRUN_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_test(NAME ${name}
    COMMAND ${DDPRUN_TORCH1_PYTHON} -m pytest -q -p no:cacheprovider -x
            ${PROJECT_SOURCE_DIR}/${file}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${name} PROPERTIES
    LABELS "integration;${ARG_LABELS}"
    TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "DDPRUN_BIN_DIR=${DDPRUN_LAUNCHER_BIN_DIR};DDPRUN_SDK_BIN_DIR=${CMAKE_BINARY_DIR}/bin;DDPRUN_BUILD_DIR=${CMAKE_BINARY_DIR};DDPRUN_SOURCE_DIR=${PROJECT_SOURCE_DIR};DDPRUN_TORCH1_PYTHON=${DDPRUN_TORCH1_PYTHON};DDPRUN_TORCH2_PYTHON=${DDPRUN_TORCH2_PYTHON};PYTHONDONTWRITEBYTECODE=1")
endfunction()

# ddprun_public_headers(hdr ...): the headers of the calling component (paths from its folder;
# a folder name ending in "/" makes everything below it public) that other components may
# include. check_boundaries (below) fails the build on any other cross-component include.
function(ddprun_public_headers)
  file(RELATIVE_PATH _dir ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  foreach(_h ${ARGN})
    set_property(GLOBAL APPEND PROPERTY DDPRUN_PUBLIC_HEADERS "${_dir}/${_h}")
  endforeach()
endfunction()

# ddprun_check_boundaries(COMPONENT=DEPS ...): after every component was added. The check runs
# in every build (it reads the sources: about 0.1 s).
function(ddprun_check_boundaries)
  get_property(_public GLOBAL PROPERTY DDPRUN_PUBLIC_HEADERS)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  add_custom_target(check_boundaries ALL
    COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/cmake/check_boundaries.py
            ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}/check_boundaries.stamp ${ARGN} -- ${_public}
    COMMENT "Checking that components include only each other's public headers"
    VERBATIM)
endfunction()
