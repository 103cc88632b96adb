// Creating the Gloo context of one rank (comm/gloo/): a TCP device listening on the bind
// address, then Gloo's connectFullMesh through our Store, all within one timeout.
#pragma once

#include <memory>

#include "comm/gloo/gloo_communicator.h"

namespace gloo::rendezvous {
class Context;
}

namespace zerod::gloo_backend {

// Sets SIGPIPE to ignored when it is at its default (a write to a dead peer must fail, not kill
// the process). Throws InputError when the bind address cannot be used, and Error(kPeerLost) when
// the mesh is not connected within options.timeout: naming the ranks that never joined (those whose
// "rank_<r>" key, which Gloo sets before waiting for anything, is absent), or Gloo's reason.
std::shared_ptr<gloo::rendezvous::Context> connect_full_mesh(const GlooOptions& options);

}  // namespace zerod::gloo_backend
