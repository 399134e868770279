#include <fax/tools/sweep.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>

#include <ATen/ATen.h>
#include <yaml-cpp/yaml.h>

#include <fax/base/config.h>
#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/io/hdf5.h>
#include <fax/io/yaml.h>

#include "yaml_fields.h"

namespace fax {
namespace {

using detail::where;

// A mapping under `prefix` as the dotted settings it makes.
void flatten_values(const YAML::Node& node, const std::string& prefix, const std::string& source,
                    std::vector<Override>& out) {
  for (const auto& item : node) {
    const std::string key = prefix + "." + item.first.Scalar();
    if (item.second.IsMap()) {
      flatten_values(item.second, key, source, out);
    } else {
      FAX_CHECK(item.second.IsScalar(), "{}: sweep grid {}: each setting takes a single value", where(source, item.second), key);
      out.emplace_back(key, item.second.Scalar());
    }
  }
}

std::vector<SweepSpec::GridValue> grid_values(const YAML::Node& node, const std::string& source, const std::string& key) {
  FAX_CHECK(node.IsSequence() && node.size() > 0,
            "{}: sweep grid {} takes a non-empty list of values, e.g. [0.01, 0.1] or [{{a: 1, b: 2}}, {{a: 3}}]",
            where(source, node), key);
  std::vector<SweepSpec::GridValue> values;
  for (const auto& item : node) {
    values.emplace_back();
    if (item.IsMap() && item.size() > 0) {
      flatten_values(item, key, source, values.back());
    } else {
      FAX_CHECK(item.IsScalar(), "{}: sweep grid {}: each value is a scalar or a mapping of settings", where(source, item), key);
      values.back().emplace_back(key, item.Scalar());
    }
  }
  return values;
}

std::vector<std::string> scalar_list(const YAML::Node& node, const std::string& source, const std::string& name) {
  FAX_CHECK(node.IsSequence() && node.size() > 0, "{}: sweep {} takes a non-empty list of values, e.g. [0.01, 0.1]",
            where(source, node), name);
  std::vector<std::string> values;
  for (const auto& item : node) {
    FAX_CHECK(item.IsScalar(), "{}: sweep {}: each value is a single scalar", where(source, item), name);
    values.push_back(item.Scalar());
  }
  return values;
}

double number(const YAML::Node& node, const std::string& source, const std::string& name) {
  return detail::number(node, source, "sweep " + name);
}

int64_t integer(const YAML::Node& node, const std::string& source, const std::string& name, int64_t low, int64_t high) {
  return detail::integer(node, source, "sweep " + name, low, high);
}

// Integers a double holds exactly; int_uniform bounds and seeds stay inside.
constexpr int64_t kExactInteger = int64_t{1} << 53;
constexpr int64_t kMaxCount = 1000000;
constexpr uint64_t kMaxTrials = 100000;

void check_key_name(const std::string& key, const YAML::Node& at, const std::string& source) {
  FAX_CHECK(!key.empty() && key.find_first_of(" =,") == std::string::npos && key.rfind("sweep", 0) != 0,
            "{}: '{}' is not a setting a sweep can vary (write dotted keys: algorithm.client_lr)", where(source, at), key);
}

RandomKey parse_random_key(const std::string& key, const YAML::Node& value, const std::string& source) {
  const std::string hint = "write {log_uniform: [low, high]}, {uniform: [low, high]}, {int_uniform: [low, high]} "
                           "or {choice: [a, b, ...]}";
  FAX_CHECK(value.IsMap() && value.size() == 1, "{}: sweep random {}: {}", where(source, value), key, hint);
  const auto item = *value.begin();
  const std::string kind = item.first.Scalar();
  RandomKey r;
  r.key = key;
  const std::string name = "random " + key;
  if (kind == "choice") {
    r.kind = RandomKey::Kind::Choice;
    r.choices = scalar_list(item.second, source, name);
    return r;
  }
  if (kind == "log_uniform") r.kind = RandomKey::Kind::LogUniform;
  else if (kind == "uniform") r.kind = RandomKey::Kind::Uniform;
  else if (kind == "int_uniform") r.kind = RandomKey::Kind::IntUniform;
  else throw Error(fmt::format("{}: sweep random {}: unknown distribution '{}'; {}", where(source, item.first), key, kind, hint));
  FAX_CHECK(item.second.IsSequence() && item.second.size() == 2, "{}: sweep {}: {} takes [low, high]",
            where(source, item.second), name, kind);
  r.low = number(item.second[0], source, name);
  r.high = number(item.second[1], source, name);
  FAX_CHECK(r.low <= r.high, "{}: sweep {}: low {} is above high {}", where(source, item.second), name, r.low, r.high);
  FAX_CHECK(r.kind != RandomKey::Kind::LogUniform || r.low > 0, "{}: sweep {}: log_uniform needs low > 0",
            where(source, item.second), name);
  const double exact = static_cast<double>(kExactInteger);
  FAX_CHECK(r.kind != RandomKey::Kind::IntUniform || (r.low == std::floor(r.low) && r.high == std::floor(r.high) &&
                                                      std::abs(r.low) <= exact && std::abs(r.high) <= exact),
            "{}: sweep {}: int_uniform takes integer bounds within +-2^53", where(source, item.second), name);
  return r;
}

// A uniform double in [0, 1) from (seed, sample, key) alone, so a sample does not depend on the
// standard library's distributions or on how many keys come before it.
double unit_draw(uint64_t seed, uint64_t sample, uint64_t key) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (sample + 1) * 0xBF58476D1CE4E5B9ull ^ (key + 1) * 0x94D049BB133111EBull;
  for (int i = 0; i < 2; ++i) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
  }
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

std::string draw(const RandomKey& r, double u) {
  switch (r.kind) {
    case RandomKey::Kind::LogUniform: return fmt::format("{:.4g}", std::exp(std::log(r.low) + u * (std::log(r.high) - std::log(r.low))));
    case RandomKey::Kind::Uniform: return fmt::format("{:.4g}", r.low + u * (r.high - r.low));
    case RandomKey::Kind::IntUniform:
      return fmt::format("{}", static_cast<int64_t>(r.low) + static_cast<int64_t>(u * (r.high - r.low + 1)));
    case RandomKey::Kind::Choice: return r.choices[static_cast<size_t>(u * static_cast<double>(r.choices.size()))];
  }
  FAX_ASSERT(false, "unknown distribution");
  return "";
}

bool is_loss(const std::string& metric) {
  return metric.size() >= 4 && metric.compare(metric.size() - 4, 4, "loss") == 0;
}

std::string join_overrides(const std::vector<Override>& overrides, const char* separator, bool with_seed) {
  std::string out;
  for (const auto& [key, value] : overrides) {
    if (!with_seed && key == "seed") continue;
    if (!out.empty()) out += separator;
    out += key + "=" + value;
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

Override parse_override(const std::string& assignment, const std::string& source) {
  const size_t eq = assignment.find('=');
  FAX_CHECK(eq != std::string::npos && eq > 0, "{}: '{}' is not key=value", source, assignment);
  return {assignment.substr(0, eq), assignment.substr(eq + 1)};
}

}  // namespace

SweepSpec SweepSpec::from_yaml(const std::string& text, const std::string& source) {
  const YAML::Node root = load_yaml(text, source);
  SweepSpec spec;
  if (!root.IsMap() || !root["sweep"]) return spec;
  const YAML::Node sweep = root["sweep"];
  FAX_CHECK(sweep.IsMap(), "{}: sweep: is a mapping (grid, random, seeds, repeats, metric, mode)", where(source, sweep));
  std::string mode;
  for (const auto& item : sweep) {
    const std::string section = item.first.Scalar();
    const YAML::Node& value = item.second;
    if (section == "grid") {
      FAX_CHECK(value.IsMap(), "{}: sweep grid: is a mapping of dotted keys to lists of values", where(source, value));
      for (const auto& axis : value) {
        const std::string key = axis.first.Scalar();
        check_key_name(key, axis.first, source);
        spec.grid.emplace_back(key, grid_values(axis.second, source, key));
      }
    } else if (section == "random") {
      FAX_CHECK(value.IsMap(), "{}: sweep random: is a mapping (samples, seed, and dotted keys with distributions)",
                where(source, value));
      for (const auto& entry : value) {
        const std::string key = entry.first.Scalar();
        if (key == "samples") {
          spec.samples = integer(entry.second, source, "random samples", 1, kMaxCount);
        } else if (key == "seed") {
          spec.sample_seed = static_cast<uint64_t>(integer(entry.second, source, "random seed", 0, kExactInteger));
        } else {
          check_key_name(key, entry.first, source);
          spec.random.push_back(parse_random_key(key, entry.second, source));
        }
      }
      FAX_CHECK(!spec.random.empty() && spec.samples > 0,
                "{}: sweep random: needs samples: N and at least one key with a distribution", where(source, value));
    } else if (section == "seeds") {
      spec.seeds = scalar_list(value, source, "seeds");
    } else if (section == "repeats") {
      const int64_t repeats = integer(value, source, "repeats", 1, kMaxCount);
      int64_t seed = 0;
      if (root["seed"] && root["seed"].IsScalar()) YAML::convert<int64_t>::decode(root["seed"], seed);
      FAX_CHECK(seed <= std::numeric_limits<int64_t>::max() - repeats, "{}: sweep repeats: seed {} + {} overflows",
                where(source, value), seed, repeats);
      for (int64_t r = 0; r < repeats; ++r) spec.seeds.push_back(std::to_string(seed + r));
    } else if (section == "metric") {
      FAX_CHECK(value.IsScalar(), "{}: sweep metric is a metric name, e.g. eval/accuracy", where(source, value));
      spec.metric = value.Scalar();
    } else if (section == "average_last") {
      spec.average_last = integer(value, source, "average_last", 1, kMaxCount);
    } else if (section == "mode") {
      FAX_CHECK(value.IsScalar(), "{}: sweep mode is max or min", where(source, value));
      mode = value.Scalar();
      FAX_CHECK(mode == "max" || mode == "min", "{}: sweep mode: '{}' is not max or min", where(source, value), mode);
    } else {
      throw Error(fmt::format("{}: unknown sweep key '{}' (sweep: takes grid, random, seeds, repeats, metric, mode, average_last)",
                              where(source, item.first), section));
    }
  }
  spec.set_metric(spec.metric, mode);
  for (const auto& axis : spec.grid) {
    for (const auto& value : axis.second) {
      for (const auto& [key, text] : value) {
        FAX_CHECK(key != "seed" || spec.seeds.empty(), "{}: sweep: seed is both a grid key and set by seeds/repeats", source);
        for (const auto& r : spec.random)
          FAX_CHECK(r.key != key, "{}: sweep: {} is both a grid key and a random key", source, key);
      }
    }
  }
  return spec;
}

SweepSpec SweepSpec::from_file(const std::string& path) { return from_yaml(read_experiment_file(path), path); }

void SweepSpec::add_grid(const std::string& assignment) {
  const Override o = parse_override(assignment, "--grid");
  std::vector<GridValue> values;
  std::stringstream in(o.second);
  for (std::string v; std::getline(in, v, ',');) {
    FAX_CHECK(!v.empty(), "--grid {}: an empty value (write key=v1,v2)", assignment);
    values.push_back({{o.first, v}});
  }
  FAX_CHECK(!values.empty(), "--grid {}: no values (write key=v1,v2)", assignment);
  FAX_CHECK(o.first != "seed" || seeds.empty(), "--grid {}: the sweep's seeds/repeats already set the seed", assignment);
  for (auto& axis : grid) {
    if (axis.first == o.first) {
      axis.second = std::move(values);
      return;
    }
  }
  grid.emplace_back(o.first, std::move(values));
}

void SweepSpec::set_metric(const std::string& name, const std::string& mode) {
  FAX_CHECK(!name.empty(), "the sweep metric is empty");
  metric = name;
  maximize = mode.empty() ? !is_loss(name) : mode == "max";
}

std::string Trial::label() const { return join_overrides(overrides, " ", true); }

std::string Trial::setting() const { return join_overrides(overrides, " ", false); }

std::vector<Trial> expand(const SweepSpec& spec) {
  // Counted before any trial is built: a few lines of grid can ask for 10^20 of them.
  uint64_t count = std::max<size_t>(1, spec.seeds.size());
  bool overflow = false;
  for (const auto& axis : spec.grid) overflow |= __builtin_mul_overflow(count, axis.second.size(), &count);
  if (!spec.random.empty()) overflow |= __builtin_mul_overflow(count, static_cast<uint64_t>(spec.samples), &count);
  FAX_CHECK(!overflow && count <= kMaxTrials, "the sweep has {} trials, more than the {} fax-run sweep runs; split it",
            overflow ? std::string("more than 10^19") : std::to_string(count), kMaxTrials);
  // Grid points as an odometer, the last key turning fastest.
  std::vector<std::vector<Override>> points{{}};
  for (const auto& axis : spec.grid) {
    std::vector<std::vector<Override>> next;
    for (const auto& point : points) {
      for (const auto& value : axis.second) {
        next.push_back(point);
        next.back().insert(next.back().end(), value.begin(), value.end());
      }
    }
    points = std::move(next);
  }
  if (!spec.random.empty()) {
    std::vector<std::vector<Override>> next;
    uint64_t sample = 0;
    for (const auto& point : points) {
      for (int64_t s = 0; s < spec.samples; ++s, ++sample) {
        next.push_back(point);
        for (size_t k = 0; k < spec.random.size(); ++k) {
          next.back().emplace_back(spec.random[k].key, draw(spec.random[k], unit_draw(spec.sample_seed, sample, k)));
        }
      }
    }
    points = std::move(next);
  }
  std::vector<Trial> trials;
  const int width = std::max(4, static_cast<int>(std::to_string(count).size()));
  for (const auto& point : points) {
    for (size_t s = 0; s < std::max<size_t>(1, spec.seeds.size()); ++s) {
      Trial t;
      t.name = fmt::format("trial-{:0{}d}", trials.size() + 1, width);
      t.overrides = point;
      if (!spec.seeds.empty()) t.overrides.emplace_back("seed", spec.seeds[s]);
      trials.push_back(std::move(t));
    }
  }
  return trials;
}

std::vector<size_t> launch_order(const SweepSpec& spec, size_t trials) {
  const size_t seeds = std::max<size_t>(1, spec.seeds.size());
  const size_t settings = trials / seeds;
  std::vector<size_t> order;
  for (size_t s = 0; s < seeds; ++s)
    for (size_t p = 0; p < settings; ++p) order.push_back(p * seeds + s);
  return order;
}

double TrialRecord::value(const std::string& metric) const {
  if (status != "done") return std::numeric_limits<double>::quiet_NaN();
  for (const auto& [name, v] : final)
    if (name == metric) return v;
  return std::numeric_limits<double>::quiet_NaN();
}

void SweepIndex::write(const std::string& path) const {
  std::vector<std::string> names, overrides, status, message;
  std::vector<double> seconds;
  std::vector<std::string> metrics;  // the union of the trials' final metrics, first-seen order
  for (const auto& t : trials) {
    names.push_back(t.name);
    overrides.push_back(join_overrides(t.overrides, "\n", true));
    status.push_back(t.status);
    message.push_back(t.message);
    seconds.push_back(t.seconds);
    for (const auto& f : t.final)
      if (std::find(metrics.begin(), metrics.end(), f.first) == metrics.end()) metrics.push_back(f.first);
  }
  h5::write_file(path, [&](h5::Writer& file) {
    file.string("/sweep/experiment", experiment);
    file.string("/sweep/base", fmt::format("{}", fmt::join(base, "\n")));
    file.string("/sweep/metric", metric);
    file.string("/sweep/mode", maximize ? "max" : "min");
    file.tensor("/sweep/average_last", at::scalar_tensor(average_last, at::kLong));
    file.strings("/trials/name", names);
    file.strings("/trials/overrides", overrides);
    file.strings("/trials/status", status);
    file.strings("/trials/message", message);
    file.tensor("/trials/seconds", at::tensor(seconds, at::kDouble));
    for (const auto& m : metrics) {
      std::vector<double> column;
      for (const auto& t : trials) {
        double v = std::numeric_limits<double>::quiet_NaN();
        for (const auto& f : t.final)
          if (f.first == m) v = f.second;
        column.push_back(v);
      }
      file.tensor("/trials/final/" + m, at::tensor(column, at::kDouble));
    }
  });
}

bool SweepIndex::is_index(const std::string& path) { return h5::File(path).exists("/sweep/experiment"); }

SweepIndex SweepIndex::read(const std::string& path) {
  const h5::File file(path);
  FAX_CHECK(file.exists("/sweep/experiment"), "{}: not a fax sweep index (no /sweep/experiment)", path);
  SweepIndex index;
  index.experiment = file.read_string("/sweep/experiment");
  index.base = split_lines(file.read_string("/sweep/base"));
  index.metric = file.read_string("/sweep/metric");
  index.maximize = file.read_string("/sweep/mode") == "max";
  const at::Tensor average_last = file.read("/sweep/average_last");
  FAX_CHECK(average_last.numel() == 1 && !at::isFloatingType(average_last.scalar_type()),
            "{}: /sweep/average_last is not one integer", path);
  index.average_last = average_last.item<int64_t>();
  const auto names = file.read_strings("/trials/name");
  const auto overrides = file.read_strings("/trials/overrides");
  const auto status = file.read_strings("/trials/status");
  const auto message = file.read_strings("/trials/message");
  const at::Tensor seconds = file.read("/trials/seconds").to(at::kDouble).contiguous();
  const size_t n = names.size();
  FAX_CHECK(overrides.size() == n && status.size() == n && message.size() == n && static_cast<size_t>(seconds.numel()) == n,
            "{}: the /trials datasets differ in length", path);
  for (size_t i = 0; i < n; ++i) {
    TrialRecord t;
    t.name = names[i];
    // A trial's files are <dir>/<name>.h5 and .log: a name must not lead out of the directory.
    FAX_CHECK(t.name.rfind("trial-", 0) == 0 && t.name.size() > 6 &&
                  t.name.find_first_not_of("0123456789", 6) == std::string::npos,
              "{}: /trials/name[{}] '{}' is not a trial name (trial-NNNN)", path, i, t.name);
    for (const auto& line : split_lines(overrides[i])) t.overrides.push_back(parse_override(line, path + ":/trials/overrides"));
    t.status = status[i];
    t.message = message[i];
    t.seconds = seconds[static_cast<int64_t>(i)].item<double>();
    index.trials.push_back(std::move(t));
  }
  if (file.exists("/trials/final")) {
    for (const auto& m : file.datasets_below("/trials/final")) {
      const at::Tensor column = file.read("/trials/final/" + m).to(at::kDouble).contiguous();
      FAX_CHECK(static_cast<size_t>(column.numel()) == n, "{}: /trials/final/{} has {} rows for {} trials", path, m,
                column.numel(), n);
      for (size_t i = 0; i < n; ++i) {
        const double v = column.data_ptr<double>()[i];
        if (!std::isnan(v)) index.trials[i].final.emplace_back(m, v);
      }
    }
  }
  return index;
}

double mean_of_last(const std::vector<double>& values, int64_t count) {
  double sum = 0;
  int64_t n = 0;
  for (auto it = values.rbegin(); it != values.rend() && n < count; ++it) {
    if (!std::isfinite(*it)) continue;
    sum += *it;
    ++n;
  }
  return n > 0 ? sum / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
}

std::vector<SettingSummary> summarize(const SweepIndex& index) {
  std::vector<SettingSummary> out;
  for (size_t i = 0; i < index.trials.size(); ++i) {
    const double v = index.trials[i].value(index.metric);
    if (std::isnan(v)) continue;
    const std::string setting = index.trials[i].trial().setting();
    auto it = std::find_if(out.begin(), out.end(), [&](const SettingSummary& s) { return s.setting == setting; });
    if (it == out.end()) {
      out.push_back({setting, {}, 0, 0});
      it = std::prev(out.end());
    }
    it->trials.push_back(i);
  }
  for (auto& s : out) {
    std::vector<double> values;
    for (size_t i : s.trials) values.push_back(index.trials[i].value(index.metric));
    std::tie(s.mean, s.std) = mean_and_std(values);
  }
  std::stable_sort(out.begin(), out.end(), [&](const SettingSummary& a, const SettingSummary& b) {
    return index.maximize ? a.mean > b.mean : a.mean < b.mean;
  });
  return out;
}

std::pair<double, double> mean_and_std(const std::vector<double>& values) {
  FAX_CHECK(!values.empty(), "the mean of no values");
  double sum = 0;
  for (double v : values) sum += v;
  const double mean = sum / static_cast<double>(values.size());
  double squares = 0;
  for (double v : values) squares += std::pow(v - mean, 2);
  return {mean, values.size() > 1 ? std::sqrt(squares / static_cast<double>(values.size() - 1)) : 0};
}

int64_t best_trial(const SweepIndex& index) {
  int64_t best = -1;
  for (size_t i = 0; i < index.trials.size(); ++i) {
    const double v = index.trials[i].value(index.metric);
    if (std::isnan(v)) continue;
    const double b = best < 0 ? 0 : index.trials[best].value(index.metric);
    if (best < 0 || (index.maximize ? v > b : v < b)) best = static_cast<int64_t>(i);
  }
  return best;
}

}  // namespace fax
