# fax_add_plugin(<name> SOURCES <files...> [OUTPUT_DIRECTORY <dir>])
# Builds an algorithm plugin: a MODULE library fax_<name>.so linked to fax::core, with hidden
# symbols except the FAX_PLUGIN entry point. fax-run finds it by name on its plugin search path
# (--plugin-dir, FAX_PLUGIN_PATH, <prefix>/lib/fax/plugins). Inside fax's own build plugins land in
# <build>/lib/fax/plugins, the same layout as an installed prefix.
function(fax_add_plugin name)
  cmake_parse_arguments(arg "" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  if(NOT arg_SOURCES)
    message(FATAL_ERROR "fax_add_plugin(${name}): SOURCES is required")
  endif()
  set(target fax_plugin_${name})
  add_library(${target} MODULE ${arg_SOURCES})
  target_link_libraries(${target} PRIVATE fax::core)
  # Every plugin of a build, for whoever needs them all built first (fax's plugin contract suite).
  set_property(GLOBAL APPEND PROPERTY FAX_PLUGIN_TARGETS ${target})
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME "fax_${name}"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(arg_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${arg_OUTPUT_DIRECTORY}")
  elseif(DEFINED FAX_PLUGIN_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${FAX_PLUGIN_OUTPUT_DIRECTORY}")
  endif()
  if(DEFINED FAX_PLUGIN_INSTALL_DIRECTORY)
    install(TARGETS ${target} LIBRARY DESTINATION "${FAX_PLUGIN_INSTALL_DIRECTORY}")
  endif()
endfunction()
