// A shared library without the FAX_PLUGIN entry point: the loader must say so.
extern "C" __attribute__((visibility("default"))) int not_a_plugin(void) { return 0; }
