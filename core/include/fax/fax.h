#pragma once

/// The one header a plugin author reads first: placements, tensor trees, the federated primitives,
/// programs and meshes, random streams, errors.

#include <fax/cohort.h>
#include <fax/communicator.h>
#include <fax/error.h>
#include <fax/placement.h>
#include <fax/primitives.h>
#include <fax/program.h>
#include <fax/rng.h>
#include <fax/tensor_tree.h>
#include <fax/version.h>
