// A library whose code crashes as soon as it is loaded (a constructor): listing plugins must
// report it and go on; running it must name it.
#include <csignal>

__attribute__((constructor)) static void crash_on_load() { std::raise(SIGSEGV); }

extern "C" __attribute__((visibility("default"))) const void* fax_plugin_info(void) { return nullptr; }
