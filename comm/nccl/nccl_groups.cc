#include "comm/nccl/nccl_groups.h"

#include "comm/group_monitor.h"
#include "comm/nccl/nccl_bootstrap.h"
#include "core/error.h"

namespace zerod {

NcclOptions nccl_group_options(const NcclOptions& world, const std::string& prefix,
                               const std::string& key, const std::string& name,
                               const std::vector<int>& global_ranks, int index) {
  ZD_CHECK(world.store != nullptr, "group '{}' needs the world's store", name);
  ZD_CHECK(!global_ranks.empty() && index >= 0 && static_cast<size_t>(index) < global_ranks.size(),
           "index {} outside group '{}' of {} ranks", index, name, global_ranks.size());
  NcclOptions o = world;
  o.rank = index;
  o.size = static_cast<int>(global_ranks.size());
  const std::string scoped = prefix.empty() ? key : prefix + "/" + key;
  o.key_prefix = nccl_backend::nccl_store_key(world.key_prefix, scoped);
  o.monitor = world.monitor != nullptr
                  ? std::make_shared<GroupPeerMonitor>(world.monitor, scoped, global_ranks, index)
                  : nullptr;
  o.group_name = name;
  o.global_ranks = global_ranks;
  return o;
}

NcclGroupFactory::NcclGroupFactory(NcclOptions world, std::string prefix)
    : world_(std::move(world)), prefix_(std::move(prefix)) {}

std::unique_ptr<Communicator> NcclGroupFactory::make(const std::string& key,
                                                     const std::string& name,
                                                     const std::vector<int>& global_ranks,
                                                     int index) {
  return make_nccl_communicator(
      nccl_group_options(world_, prefix_, key, name, global_ranks, index));
}

}  // namespace zerod
