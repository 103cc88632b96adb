// The Gloo communicators of a world's sub-groups (comm/process_groups.h).
//
// Each sub-group's communicator is a Gloo communicator of its own (its own connections, thread
// and sequence numbers) made from the options of the world's communicator:
//   rank = this rank's index in the group, size = the group's size;
//   store = PrefixStore("<prefix>/<key>", the world's store): the group's rendezvous keys live
//     beside the world's, one namespace per group ("pg/tensor.4/rank_1");
//   the world's bind address, timeout, algorithm and segment size;
//   monitor = a GroupPeerMonitor (comm/group_monitor.h) over the world's monitor (none when the
//     world has none), so a dead or stalled member is reported by its global rank;
//   group_name / global_ranks: errors name the group, its members and every rank by its global
//     rank ("all_reduce #3 (...) failed on rank 5 of group 'tensor' (global ranks 4, 5) ...").
// Build a world's groups once per store namespace: a second build under the same prefix would
// meet the first one's keys (give it another prefix).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/process_groups.h"

namespace zerod {

// The options of a sub-group's communicator, derived from `world` as above.
GlooOptions gloo_group_options(const GlooOptions& world, const std::string& prefix,
                               const std::string& key, const std::string& name,
                               const std::vector<int>& global_ranks, int index);

class GlooGroupFactory : public SubCommunicatorFactory {
 public:
  // `world`: the options the world's communicator was made with (its store, bind address,
  // timeout, monitor, algorithm). `prefix`: the namespace of the groups' keys in that store.
  explicit GlooGroupFactory(GlooOptions world, std::string prefix = "pg");

  std::unique_ptr<Communicator> make(const std::string& key, const std::string& name,
                                     const std::vector<int>& global_ranks, int index) override;

 private:
  GlooOptions world_;
  std::string prefix_;
};

}  // namespace zerod
