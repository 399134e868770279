#pragma once

/// The SPMD layer: placements, meshes and programs, the federated primitives and their autograd
/// rules, communicators, ordered sums and per-client state.

#include <fax/spmd/client_states.h>
#include <fax/spmd/communicator.h>
#include <fax/spmd/local_communicator.h>
#include <fax/spmd/mesh.h>
#include <fax/spmd/ordered_sum.h>
#include <fax/spmd/placement.h>
#include <fax/spmd/primitives.h>
#include <fax/spmd/secure_sum.h>
