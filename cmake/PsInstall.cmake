# Install rules and the CMake package: a user project does
#   find_package(ps CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE ps::kvstore)
include(CMakePackageConfigHelpers)

set(PS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ps)
set(CMAKE_INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")

install(TARGETS ps_core ps_scheduler ps_kvstore
  EXPORT psTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ps/include/ps scheduler/include/ps kvstore/include/ps
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(PS_INSTALLED_PROGRAMS ps-scheduler ps-server ps-kvstore-check)
if(TARGET ps-train)
  list(APPEND PS_INSTALLED_PROGRAMS ps-train)
endif()
# Every tool README.md's table lists is installed (tests/install checks the table against the
# prefix); ps-bench runs ps-bench-mpi-allreduce from its own directory when MPI was found.
foreach(tool ps-bench ps-bench-gpu-staging ps-bench-mpi-allreduce)
  if(TARGET ${tool})
    list(APPEND PS_INSTALLED_PROGRAMS ${tool})
  endif()
endforeach()
install(TARGETS ${PS_INSTALLED_PROGRAMS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
set_target_properties(${PS_INSTALLED_PROGRAMS} ps_scheduler ps_kvstore PROPERTIES
  INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
# The launcher finds ps-server and ps-scheduler next to itself. The other Python tools
# README.md's table lists go beside it (bed_bench.py finds launch.py, testbed.py and the
# binaries there; testbed.py its delay line, delayline.py; ps-plan.py and testbed.py the
# module they share, cli_args.py).
install(PROGRAMS tools/launch.py tools/plot_bench.py tools/testbed.py tools/delayline.py
                 tools/ps-plan.py tools/bench/bed_bench.py
        DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES tools/cli_args.py DESTINATION ${CMAKE_INSTALL_BINDIR})
# The documentation --help points at: README.md and docs/ (their links stay relative).
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs DESTINATION ${CMAKE_INSTALL_DOCDIR})

install(EXPORT psTargets NAMESPACE ps:: DESTINATION ${PS_CMAKE_DIR})
configure_package_config_file(cmake/psConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/psConfig.cmake INSTALL_DESTINATION ${PS_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/psConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/psConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/psConfigVersion.cmake
  DESTINATION ${PS_CMAKE_DIR})
