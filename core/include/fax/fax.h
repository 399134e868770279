#pragma once

/// The plugin API, and all of it: what libfax_core offers (base, spmd, nn, train). A plugin never
/// sees the coordinator, the run log or YAML; those live in fax::runtime and fax::io, which plugins
/// do not link.

#include <fax/base.h>
#include <fax/nn.h>
#include <fax/spmd.h>
#include <fax/train.h>
