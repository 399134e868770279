// Mapping a client function over a server value (broadcast it first).
// expect: no matching function for call to .map_clients\(
#include <fax/fax.h>

void use(const fax::Server<at::Tensor>& server) {
  auto square = [](const at::Tensor& x) { return x.mul(x); };
#ifdef FAX_CONTROL
  (void)fax::map_clients(square, fax::broadcast(server));
#else
  (void)fax::map_clients(square, server);
#endif
}
