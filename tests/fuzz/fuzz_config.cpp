// libFuzzer target: experiment YAML through the config loader, resolved against fax's schema and
// written back. fax::Error is the expected answer to bad input; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include <fax/config.h>
#include <fax/error.h>
#include <fax/experiment.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    fax::Config config = fax::Config::from_yaml(text, "fuzz.yaml");
    config.set("seed=1");
    config.resolve(fax::experiment_schema());
    fax::Config::from_yaml(config.to_yaml(), "resolved").resolve(fax::experiment_schema());
  } catch (const fax::Error&) {
  }
  return 0;
}
