// Averaging a server-placed tree over clients.
// expect: no matching function for call to .mean\(const fax::Server<fax::TensorTree>&\)
#include <fax/fax.h>

void use(const fax::Server<fax::TensorTree>& server, const fax::Clients<fax::TensorTree>& clients) {
#ifdef FAX_CONTROL
  (void)server;
  (void)fax::mean(clients);
#else
  (void)clients;
  (void)fax::mean(server);
#endif
}
