# FAX_SANITIZE=ON: AddressSanitizer + UndefinedBehaviorSanitizer for everything fax builds. The
# flags are also carried by fax::core's interface, so anything linking it (plugins, out-of-tree
# consumers) loads the sanitizer runtime first, as ASan requires. UBSan findings are fatal.
set(FAX_SANITIZER_FLAGS "")
if(FAX_SANITIZE)
  set(FAX_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_compile_options(${FAX_SANITIZER_FLAGS})
  add_link_options(-fsanitize=address,undefined)
endif()

# FAX_FUZZ=ON: the libraries get libFuzzer's coverage instrumentation plus ASan and UBSan; the fuzz
# targets link the fuzzer's main (tests/fuzz).
if(FAX_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FAX_FUZZ needs clang (libFuzzer): configure with CXX=clang++")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
