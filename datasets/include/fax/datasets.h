#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fax/config.h>
#include <fax/data.h>

namespace fax {

/// A data set fax builds by name (`data.name` in an experiment).
struct DatasetEntry {
  std::string name;
  std::string description;
  std::vector<ConfigKey> keys;  ///< relative to "data."
  std::function<std::unique_ptr<FederatedDataset>(const Config&)> create;
  /// About how many bytes the data set holds once created, from its settings and the sizes of its
  /// files, without reading them: fax-run checks it against the machine before create().
  std::function<int64_t(const Config&)> estimate_bytes;
};

const std::vector<DatasetEntry>& dataset_registry();
/// Throws fax::Error listing the available data sets when `name` is unknown.
const DatasetEntry& find_dataset(const std::string& name);

}  // namespace fax
