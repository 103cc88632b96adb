// A world of threads with a mesh's process groups, for tests of code that runs over them.
#pragma once

#include <memory>

#include "comm/gloo/gloo_groups.h"
#include "comm/process_groups.h"
#include "tests/unit/comm/comm_test_util.h"

namespace zerod::test {

// Runs body(rank, groups) on the ranks of a world of `shape` (threads, Gloo on 127.0.0.1, 30 s
// timeouts), with the mesh's process groups.
template <class F>
void run_mesh(const MeshShape& shape, F&& body) {
  auto store = std::make_shared<MemoryStore>();
  auto monitor = std::make_shared<LocalPeerMonitor>(shape.world());
  run_ranks(shape.world(), [&](int r) {
    GlooOptions o;
    o.rank = r;
    o.size = shape.world();
    o.store = std::make_shared<PrefixStore>("world", store);
    o.bind_address = "127.0.0.1";
    o.timeout = Ms(30000);
    o.monitor = monitor;
    std::unique_ptr<Communicator> world = make_gloo_communicator(o);
    GlooGroupFactory factory(o);
    ProcessGroups groups(Mesh(shape), r, world.get(), &factory);
    body(r, groups);
  });
}

}  // namespace zerod::test
