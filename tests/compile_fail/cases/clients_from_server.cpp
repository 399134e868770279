// Treating a server value as a clients value without broadcast.
// expect: conversion from .(const )?fax::Server<at::Tensor>. to non-scalar type .fax::Clients<at::Tensor>.
#include <fax/fax.h>

void use(const fax::Server<at::Tensor>& server) {
#ifdef FAX_CONTROL
  fax::Clients<at::Tensor> clients = fax::broadcast(server);
#else
  fax::Clients<at::Tensor> clients = server;
#endif
  (void)clients;
}
