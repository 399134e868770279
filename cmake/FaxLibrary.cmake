# fax_add_library(<folder> SOURCES <files...> [PUBLIC <deps...>] [PRIVATE <deps...>])
# One shared library per folder: libfax_<folder>.so, alias and export name fax::<folder>, public
# headers in <folder>/include, installed to include/fax-<folder>/: each layer's own include folder,
# so that, installed as in the build tree, a target sees only the headers of what it links.
function(fax_add_library folder)
  cmake_parse_arguments(arg "" "" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
  set(target fax_${folder})
  add_library(${target} SHARED ${arg_SOURCES})
  add_library(fax::${folder} ALIAS ${target})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME ${target} EXPORT_NAME ${folder}
    VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  target_include_directories(${target} PUBLIC
    "$<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>"
    "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/fax-${folder}>")
  target_link_libraries(${target} PUBLIC ${arg_PUBLIC} PRIVATE ${arg_PRIVATE})
  target_compile_features(${target} PUBLIC cxx_std_17)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
endfunction()
