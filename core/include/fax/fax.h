#pragma once

/// The one header a plugin author reads first: placements, tensor trees, the federated primitives,
/// programs and meshes, random streams, errors, and the algorithm plugin interface (models, data,
/// local training, configuration).

#include <fax/algorithm.h>
#include <fax/client_states.h>
#include <fax/client_update.h>
#include <fax/cohort.h>
#include <fax/config.h>
#include <fax/data.h>
#include <fax/layers.h>
#include <fax/local_training.h>
#include <fax/model.h>
#include <fax/models.h>
#include <fax/plugin.h>
#include <fax/communicator.h>
#include <fax/error.h>
#include <fax/placement.h>
#include <fax/primitives.h>
#include <fax/privacy.h>
#include <fax/program.h>
#include <fax/remote.h>
#include <fax/rng.h>
#include <fax/tensor_tree.h>
#include <fax/version.h>
