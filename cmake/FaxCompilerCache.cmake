# Route compilations through ccache when it is installed. Precompiled headers need the
# pch_defines and time_macros sloppiness, otherwise every PCH user misses the cache. The base
# directory makes paths inside the checkout relative, so a fresh clone elsewhere (CI) hits the
# cache that an earlier clone filled.
find_program(FAX_CCACHE ccache)
if(FAX_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      "${CMAKE_COMMAND};-E;env;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_BASEDIR=${PROJECT_SOURCE_DIR};CCACHE_NOHASHDIR=1;${FAX_CCACHE}")
endif()
