// libFuzzer target: experiment YAML through the config loader, resolved against fax's schema and
// written back, and through the sweep-section parser with its trials expanded (at most 10,000:
// a sweep that large is legal, just slow to list). fax::Error is the expected answer to bad
// input; anything else is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include <fax/base/config.h>
#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/runtime/experiment.h>
#include <fax/tools/sweep.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    fax::Config config = fax::parse_config(text, "fuzz.yaml");
    fax::apply_override(config, "seed=1");
    config.resolve(fax::experiment_schema());
    fax::parse_config(fax::config_to_yaml(config), "resolved").resolve(fax::experiment_schema());
  } catch (const fax::Error&) {
  }
  try {
    const fax::SweepSpec spec = fax::SweepSpec::from_yaml(text, "fuzz.yaml");
    // Only sweeps of at most 10,000 trials are expanded, counted without overflow.
    size_t trials = 1;
    auto times = [&](size_t factor) { trials = factor == 0 || trials > 10000 / factor ? 10001 : trials * factor; };
    times(std::max<size_t>(1, spec.seeds.size()));
    if (!spec.random.empty()) times(static_cast<size_t>(spec.samples));
    for (const auto& axis : spec.grid) times(axis.second.size());
    if (trials <= 10000) {
      for (const auto& t : fax::expand(spec)) (void)t.label();
    }
  } catch (const fax::Error&) {
  }
  return 0;
}
