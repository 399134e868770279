#pragma once

/// Neural networks batched over clients: layers, the model interface and the built-in models.

#include <fax/nn/builtin_models.h>
#include <fax/nn/layers.h>
#include <fax/nn/model.h>
#include <fax/nn/torchscript.h>
