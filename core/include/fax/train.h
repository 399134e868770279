#pragma once

/// Training: the data set interface, local training, client updates, the algorithm interface and
/// its plugin ABI, privacy accounting.

#include <fax/train/aggregation.h>
#include <fax/train/algorithm.h>
#include <fax/train/client_update.h>
#include <fax/train/dataset.h>
#include <fax/train/local_training.h>
#include <fax/train/plugin.h>
#include <fax/train/privacy.h>
