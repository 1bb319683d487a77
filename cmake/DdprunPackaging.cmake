# The Debian package of ddprun (CPack, DEB generator), configured in the static build that
# scripts/package makes (DDPRUN_STATIC=ON, SDK off): the static ddprun and ddpstore from this
# build, the Python workers' `ddprun` module, and the worker SDK (headers, libddprun_sdk.a, find_package(ddprun) files) installed
# from the worker-sdk/ directory of a build against Debian's LibTorch 1.13, so the SDK is
# packaged from what that build already compiled.
include(GNUInstallDirs)

install(TARGETS ddprun ddpstore RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The documentation as the repository lays it out, so that README.md's links into docs/, the
# component READMEs and the benchmark figures resolve under /usr/share/doc/ddprun too.
file(GLOB_RECURSE DDPRUN_DOCS RELATIVE ${PROJECT_SOURCE_DIR}
  ${PROJECT_SOURCE_DIR}/docs/*.md ${PROJECT_SOURCE_DIR}/agent/*.md
  ${PROJECT_SOURCE_DIR}/launcher/*.md ${PROJECT_SOURCE_DIR}/store/*.md
  ${PROJECT_SOURCE_DIR}/worker-sdk/*.md ${PROJECT_SOURCE_DIR}/examples/*.md)
list(APPEND DDPRUN_DOCS README.md tests/bench/README.md)
foreach(doc IN LISTS DDPRUN_DOCS)
  get_filename_component(doc_dir ${doc} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${doc} DESTINATION ${CMAKE_INSTALL_DOCDIR}/${doc_dir})
endforeach()
# The pure-Python `ddprun` module for Python workers (in-memory checkpoints, heartbeats), where
# Debian's python3 finds it.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/worker-sdk/python/ddprun
  DESTINATION lib/python3/dist-packages FILES_MATCHING PATTERN "*.py")

set(DDPRUN_PACKAGE_SDK_DIR "" CACHE PATH
  "worker-sdk/ directory of a build against Debian's LibTorch whose install joins the package")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "ddprun")
set(CPACK_PACKAGE_CONTACT "ddprun maintainers <maintainers@ddprun.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "drop-in replacement for torchrun, with a c10d store and a C++ DDP SDK")
# The body of the Debian description, after the summary line: CPack indents it; an empty line
# becomes " .".
set(CPACK_PACKAGE_DESCRIPTION "ddprun launches PyTorch distributed jobs as torchrun does (same flags,
same worker environment, elastic restarts), as one small static program; ddpstore is a
standalone c10d TCPStore-compatible server. Both need no shared library.

The worker SDK (headers, static library and CMake package files: find_package(ddprun)
gives the target ddprun::sdk) brings DistributedDataParallel to LibTorch C++ programs.
It is built against Debian's LibTorch 1.13 and needs libtorch-dev to compile against.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE amd64)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# ddprun and ddpstore are static: no Depends. Only the SDK part wants LibTorch, the one it was
# compiled against.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libtorch-dev (>= 1.13), libtorch-dev (<< 1.14~)")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)  # executables only: CMake does not strip static libraries
set(CPACK_INSTALL_CMAKE_PROJECTS "${CMAKE_BINARY_DIR};ddprun;ALL;/")
if(DDPRUN_PACKAGE_SDK_DIR)
  list(APPEND CPACK_INSTALL_CMAKE_PROJECTS "${DDPRUN_PACKAGE_SDK_DIR};ddprun_sdk;ALL;/")
endif()
include(CPack)
