// Mapping a server function over a clients value.
// expect: no matching function for call to .map_server\(
#include <fax/fax.h>

void use(const fax::Clients<at::Tensor>& clients) {
  auto square = [](const at::Tensor& x) { return x.mul(x); };
#ifdef FAX_CONTROL
  (void)fax::map_server(square, fax::sum(clients));
#else
  (void)fax::map_server(square, clients);
#endif
}
