# Route compilations through ccache when it is installed. Precompiled headers need the
# pch_defines and time_macros sloppiness, otherwise every PCH user misses the cache.
find_program(FAX_CCACHE ccache)
if(FAX_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      "${CMAKE_COMMAND};-E;env;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;${FAX_CCACHE}")
endif()
