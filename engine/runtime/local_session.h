// The NodeSession of a job that runs on one node (nnodes == 1): no rendezvous server, an
// in-memory store shared by the local ranks (threads), a LocalPeerMonitor. Needs no gRPC, so
// single-node multi-rank training works in every build.
#pragma once

#include <memory>

#include "engine/runtime/launch.h"
#include "engine/runtime/node_session.h"

namespace zerod {

// Throws InputError when spec.nnodes != 1 (several nodes need the gRPC rendezvous:
// start_node_session in engine/runtime/grpc/). Local rank failures reach the engine through
// its own threads, so world_failed() stays false and failure callbacks never run; barrier()
// and leave() have nothing to wait for.
std::unique_ptr<NodeSession> start_local_session(const LaunchSpec& spec);

}  // namespace zerod
