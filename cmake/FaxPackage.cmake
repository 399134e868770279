# Makes fax consumable with find_package(fax CONFIG): from the build tree (export) and from an
# install prefix (install(EXPORT)).
include(CMakePackageConfigHelpers)

set(FAX_CMAKE_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/fax")

install(TARGETS fax_core fax_io fax_runtime fax_tools fax_datasets EXPORT faxTargets
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(DIRECTORY core/include/ io/include/ runtime/include/ tools/include/ datasets/include/
  "${PROJECT_BINARY_DIR}/core/include/"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(EXPORT faxTargets NAMESPACE fax:: DESTINATION "${FAX_CMAKE_INSTALL_DIR}")

configure_package_config_file(cmake/faxConfig.cmake.in "${PROJECT_BINARY_DIR}/faxConfig.cmake"
  INSTALL_DESTINATION "${FAX_CMAKE_INSTALL_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/faxConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/faxConfig.cmake" "${PROJECT_BINARY_DIR}/faxConfigVersion.cmake"
  cmake/FaxPlugin.cmake
  DESTINATION "${FAX_CMAKE_INSTALL_DIR}")

export(EXPORT faxTargets NAMESPACE fax:: FILE "${PROJECT_BINARY_DIR}/faxTargets.cmake")
# The build tree's package finds fax_add_plugin next to its config, as an installed one does.
configure_file(cmake/FaxPlugin.cmake "${PROJECT_BINARY_DIR}/FaxPlugin.cmake" COPYONLY)
