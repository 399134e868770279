#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fax/base/config.h>
#include <fax/base/registry.h>
#include <fax/train/dataset.h>

namespace fax {

/// A data set fax builds by name (`data.name` in an experiment); keys relative to "data.".
struct DatasetEntry : RegistryEntry<std::unique_ptr<FederatedDataset>, const Config&> {
  /// About how many bytes the data set holds once created, from its settings and the sizes of its
  /// files, without reading them: fax-run checks it against the machine before create().
  std::function<int64_t(const Config&)> estimate_bytes;
};

const std::vector<DatasetEntry>& dataset_registry();
/// Throws fax::Error listing the available data sets when `name` is unknown.
const DatasetEntry& find_dataset(const std::string& name);

}  // namespace fax
