// Summing a server value: sum() reduces over clients and takes clients-placed values only.
// expect: no matching function for call to .sum\(const fax::Server<at::Tensor>&\)
#include <fax/fax.h>

void use(const fax::Server<at::Tensor>& server, const fax::Clients<at::Tensor>& clients) {
#ifdef FAX_CONTROL
  (void)server;
  (void)fax::sum(clients);
#else
  (void)clients;
  (void)fax::sum(server);
#endif
}
