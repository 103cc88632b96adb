// The multi-node NodeSession over gRPC (engine/runtime/node_session.h):
//
//   1. Hosting: node 0 hosts the Rendezvous service at exactly --master HOST:PORT (an occupied
//      port is an InputError naming the address). A node whose rank is left to the master
//      (-1) hosts it if it can bind that address, and otherwise joins as a client.
//   2. Connecting: the node retries reaching the master (100 ms backing off to 1 s) until the
//      rendezvous timeout, then fails with Error(kPeerLost) naming the address and how long it
//      tried.
//   3. Join: blocks until every node joined. Disagreeing nodes (job hash, --nnodes,
//      --nproc-per-node, a node rank claimed twice) are refused: InputError (exit 2) on the
//      refused node and on every node waiting with it, with both values in the message. A node
//      that never comes fails the others at the timeout (kPeerLost) naming the missing ranks.
//   4. Running: a heartbeat stream carries this node's ranks' progress to the master and
//      brings back the world's status. The world fails when any node dies or fails, or when
//      the master cannot be reached (its ranks are then reported dead, "master unreachable").
//   5. Leaving: leave(reason), or the destructor. The master node, leaving cleanly, keeps
//      serving until the other nodes have left (at most SessionOptions::leave_grace).
#pragma once

#include <memory>

#include "engine/runtime/launch.h"
#include "engine/runtime/node_session.h"

namespace zerod {

class RendezvousServer;

// Hosts (when this node is the master) and joins the rendezvous of `spec`; returns once every
// node has joined. Throws InputError (exit 2) or Error(kPeerLost) (exit 3) as described above.
std::unique_ptr<NodeSession> start_node_session(const LaunchSpec& spec,
                                                const SessionOptions& options);

// Tests: end `session`'s heartbeat stream abruptly without leaving, as a crash would look to
// the master. The session must come from start_node_session.
void cut_heartbeat_for_testing(NodeSession& session);

// The server `session` hosts, or nullptr when another process hosts it.
RendezvousServer* hosted_server(NodeSession& session);

}  // namespace zerod
