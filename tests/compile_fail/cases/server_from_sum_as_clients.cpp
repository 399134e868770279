// Keeping a reduced (server) value as if it were still per client.
// expect: conversion from .(const )?fax::Server<at::Tensor>. to non-scalar type .fax::Clients<at::Tensor>.
#include <fax/fax.h>

void use(const fax::Clients<at::Tensor>& clients) {
#ifdef FAX_CONTROL
  fax::Server<at::Tensor> total = fax::sum(clients);
#else
  fax::Clients<at::Tensor> total = fax::sum(clients);
#endif
  (void)total;
}
