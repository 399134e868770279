// A weighted mean of a server value (weights are per client, the value must be too).
// expect: no matching function for call to .weighted_mean\(const fax::Server<at::Tensor>&
#include <fax/fax.h>

void use(const fax::Server<at::Tensor>& server, const fax::Clients<at::Tensor>& clients,
         const fax::Clients<at::Tensor>& weights) {
#ifdef FAX_CONTROL
  (void)server;
  (void)fax::weighted_mean(clients, weights);
#else
  (void)clients;
  (void)fax::weighted_mean(server, weights);
#endif
}
