#pragma once

/// fax's base: tensor trees, errors, random streams, cohorts, settings (keys, schemas, values),
/// interrupts, registries and the version.

#include <fax/base/cohort.h>
#include <fax/base/config.h>
#include <fax/base/error.h>
#include <fax/base/fingerprint.h>
#include <fax/base/interrupt.h>
#include <fax/base/registry.h>
#include <fax/base/rng.h>
#include <fax/base/settings.h>
#include <fax/base/tensor_tree.h>
#include <fax/base/version.h>
