# Makes fax consumable with find_package(fax CONFIG): from the build tree (export) and from an
# install prefix (install(EXPORT)).
include(CMakePackageConfigHelpers)

set(FAX_CMAKE_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/fax")

install(TARGETS fax_core fax_io fax_runtime fax_tools fax_datasets EXPORT faxTargets
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
foreach(layer core io runtime tools datasets)
  install(DIRECTORY ${layer}/include/ DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/fax-${layer}")
endforeach()
install(DIRECTORY "${PROJECT_BINARY_DIR}/core/include/" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/fax-core")
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
