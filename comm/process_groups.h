// Named process groups over the job's device mesh (DESIGN.md section 8): the communicators of one
// rank, built once at start-up, each named after the mesh axes it spans.
//
// ProcessGroups builds this rank's group along each of the following axes, in this order on every
// rank (comm/mesh.h gives the members; the world rank order is Megatron's, tensor fastest):
//
//   tensor, context, data, data x context, tensor x context, pipeline, tensor x pipeline, world
//
//   data x context   ZeRO's shards: dense units are partitioned over dp x cp (zero())
//   tensor x context the model-parallel group: partial sums of the global gradient norm
//                    (model_parallel())
//   pipeline         the stage boundaries' point-to-point messages and the tied embedding
//   tensor x pipeline the ranks holding disjoint parts of one replica's gradients after ZeRO's
//                    reduction: partial sums of the global gradient norm (model_norm())
//
// Each group gets its communicator by these rules, which depend only on the mesh, so every member
// of a group decides the same way:
//   1. a group as large as the world IS the world's communicator (the one passed in, not a new
//      one): a job without `parallelism`, where data spans the world, runs on exactly the
//      communicator it had before process groups existed;
//   2. groups with the same members share one communicator object (data x context is data when
//      context is 1; every group of one rank is {this rank});
//   3. a group of one rank gets a SelfCommunicator (comm/self/), made once;
//   4. any other group gets a new communicator from the SubCommunicatorFactory (Gloo:
//      comm/gloo/gloo_groups.h; NCCL: comm/nccl/nccl_groups.h), made under the group's key.
// Creation cannot deadlock: at each step of the order every rank is making the communicator of
// the one group along those axes that holds it, and all its members are at the same step. A
// failure (a member never joins) throws the factory's error: kPeerLost naming the group.
//
// Using a group: collectives on group.comm() run among group.ranks() only; group.rank() is this
// rank's index there (the rank collectives such as all_gather use). A communicator shared by two
// groups (rule 2) is one stream of collectives: issue on it in the same order on every member, as
// on any communicator. Sub-communicators carry the world's timeout, their own flight recorder and
// peer-loss handling; their errors name the group and its global ranks.
//
// Threads: built and destroyed on the rank's thread; after construction the object is read-only,
// while each communicator keeps its own threading rules. Sub-communicators are destroyed with the
// ProcessGroups (never the world's communicator, which the caller owns and must outlive it).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mesh.h"
#include "comm/self/self_communicator.h"

namespace zerod {

// Makes the communicator of one sub-group of the world (more than one rank, fewer than all).
// ProcessGroups calls it on every member of the group, at the same step of its order.
class SubCommunicatorFactory {
 public:
  virtual ~SubCommunicatorFactory() = default;
  // key: the group's rendezvous namespace, unique in the world and the same on every member
  //      ("tensor.4": the group's name and its first global rank);
  // name: for messages ("tensor", "data x context");
  // global_ranks: the members, ascending; index: this rank's position there (its rank in the new
  //      communicator). Throws what the backend's creation throws (kPeerLost on a timeout).
  virtual std::unique_ptr<Communicator> make(const std::string& key, const std::string& name,
                                             const std::vector<int>& global_ranks, int index) = 0;
};

class ProcessGroup {
 public:
  ProcessGroup(std::string name, std::string key, std::vector<MeshAxis> axes,
               std::vector<int> ranks, int index, Communicator* comm, bool is_world);

  // "tensor", "context", "data", "data x context", "tensor x context", "pipeline", "world".
  const std::string& name() const { return name_; }
  // The rendezvous key of its communicator ("tensor.4"): the key of the first group with these
  // members in the build order (for a communicator made by the factory).
  const std::string& key() const { return key_; }
  // The mesh axes it spans, slowest first.
  const std::vector<MeshAxis>& axes() const { return axes_; }
  // The members' global ranks, ascending.
  const std::vector<int>& ranks() const { return ranks_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  // This rank's index in ranks() (its rank in comm()).
  int rank() const { return index_; }
  int global_rank(int index) const;
  Communicator& comm() const { return *comm_; }
  // Its communicator is the world's (rule 1).
  bool is_world() const { return is_world_; }
  // "group 'tensor' (global ranks 4, 5)".
  std::string describe() const;

 private:
  std::string name_;
  std::string key_;
  std::vector<MeshAxis> axes_;
  std::vector<int> ranks_;
  int index_ = 0;
  Communicator* comm_ = nullptr;
  bool is_world_ = false;
};

class ProcessGroups {
 public:
  // `mesh`: the job's mesh; its world must be the world communicator's size (1 when `world` is
  // null, a world of one). `rank`: this rank's global rank (world->rank()). `factory`: makes the
  // sub-groups' communicators; only used by the constructor, may be null when no group needs one
  // (Error(kInternal) otherwise). `self_copy`: the copy of the SelfCommunicator of one-rank
  // groups (null: host memory; a GPU backend passes its device copy).
  ProcessGroups(const Mesh& mesh, int rank, Communicator* world, SubCommunicatorFactory* factory,
                SelfCommunicator::Copy self_copy = nullptr);
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  const Mesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }
  int world_size() const { return mesh_.world(); }

  // This rank's group along exactly `axes` (any order; axes of size 1 count). One of the built
  // sets above; Error(kInternal) naming the built ones otherwise.
  const ProcessGroup& group(std::initializer_list<MeshAxis> axes) const;
  const ProcessGroup& tensor() const { return group({MeshAxis::kTensor}); }
  const ProcessGroup& context() const { return group({MeshAxis::kContext}); }
  const ProcessGroup& data() const { return group({MeshAxis::kData}); }
  const ProcessGroup& pipeline() const { return group({MeshAxis::kPipeline}); }
  // data x context: the ranks among which ZeRO shards dense units.
  const ProcessGroup& zero() const { return group({MeshAxis::kData, MeshAxis::kContext}); }
  // tensor x context: the ranks that hold parts of one model replica's stage.
  const ProcessGroup& model_parallel() const {
    return group({MeshAxis::kTensor, MeshAxis::kContext});
  }
  // tensor x pipeline: where the global gradient norm's partial sums are added up.
  const ProcessGroup& model_norm() const { return group({MeshAxis::kTensor, MeshAxis::kPipeline}); }
  const ProcessGroup& world() const;

  // Every group, in the build order.
  const std::vector<ProcessGroup>& all() const { return groups_; }
  // How many communicators the factory made (distinct sub-groups of more than one rank and fewer
  // than all).
  int made_by_factory() const { return made_by_factory_; }

 private:
  void add(const char* name, std::initializer_list<MeshAxis> axes, SubCommunicatorFactory* factory);

  Mesh mesh_;
  int rank_;
  Communicator* world_comm_;
  SelfCommunicator::Copy self_copy_;
  std::vector<std::unique_ptr<Communicator>> owned_;  // made here, destroyed in reverse order
  std::vector<ProcessGroup> groups_;
  std::vector<uint8_t> masks_;  // groups_[i]'s axes as a bit set
  int made_by_factory_ = 0;
};

}  // namespace zerod
