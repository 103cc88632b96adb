// The NCCL communicators of a world's sub-groups (comm/process_groups.h).
//
// Each sub-group gets an NCCL communicator of its own, created as the world's is
// (nccl_bootstrap.h) from the options of the world's communicator, with a unique id per group:
//   rank = this rank's index in the group, size = the group's size;
//   the world's store, with key_prefix = "<world key_prefix>/<prefix>/<key>": the group's rank 0
//     (its lowest global rank) publishes the group's ncclUniqueId there ("pg/tensor.4/
//     nccl_unique_id") and every member publishes its joined key beside it;
//   the world's device, compute stream and timeout;
//   monitor = a GroupPeerMonitor (comm/group_monitor.h) over the world's monitor (none when the
//     world has none), so a dead or stalled member is reported by its global rank;
//   group_name / global_ranks: errors name the group, its members and every rank by its global
//     rank, as the Gloo backend's.
// (ncclCommSplit would spare the id exchange; a group of this kind needs nothing from it.) Build a
// world's groups once per store namespace (another `prefix` for a second build).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/nccl/nccl_communicator.h"
#include "comm/process_groups.h"

namespace zerod {

// The options of a sub-group's communicator, derived from `world` as above.
NcclOptions nccl_group_options(const NcclOptions& world, const std::string& prefix,
                               const std::string& key, const std::string& name,
                               const std::vector<int>& global_ranks, int index);

class NcclGroupFactory : public SubCommunicatorFactory {
 public:
  // `world`: the options the world's communicator was made with. `prefix`: the namespace of the
  // groups' keys under the world's key prefix.
  explicit NcclGroupFactory(NcclOptions world, std::string prefix = "pg");

  std::unique_ptr<Communicator> make(const std::string& key, const std::string& name,
                                     const std::vector<int>& global_ranks, int index) override;

 private:
  NcclOptions world_;
  std::string prefix_;
};

}  // namespace zerod
