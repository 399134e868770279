// Broadcasting a clients value: only the server broadcasts.
// expect: no matching function for call to .broadcast\(const fax::Clients<at::Tensor>&\)
#include <fax/fax.h>

void use(const fax::Server<at::Tensor>& server, const fax::Clients<at::Tensor>& clients) {
#ifdef FAX_CONTROL
  (void)clients;
  (void)fax::broadcast(server);
#else
  (void)server;
  (void)fax::broadcast(clients);
#endif
}
