#include "comm/process_groups.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "comm/rank_names.h"
#include "core/error.h"

namespace zerod {

namespace {

constexpr MeshAxis kSlowToFast[] = {MeshAxis::kPipeline, MeshAxis::kData, MeshAxis::kContext,
                                    MeshAxis::kTensor};

uint8_t axis_bit(MeshAxis a) {
  return static_cast<uint8_t>(1u << static_cast<unsigned>(a));
}

uint8_t axes_mask(std::initializer_list<MeshAxis> axes) {
  uint8_t m = 0;
  for (MeshAxis a : axes) m |= axis_bit(a);
  return m;
}

std::string describe_axes(uint8_t mask) {
  std::vector<std::string> names;
  for (MeshAxis a : kSlowToFast) {
    if (mask & axis_bit(a)) names.emplace_back(mesh_axis_name(a));
  }
  return fmt::format("{}", fmt::join(names, " x "));
}

// "data x context" -> "data_x_context": store keys without spaces.
std::string key_name(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c == ' ') {
      if (!out.empty() && out.back() != '_') out += '_';
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ProcessGroup
// ---------------------------------------------------------------------------------------------

ProcessGroup::ProcessGroup(std::string name, std::string key, std::vector<MeshAxis> axes,
                           std::vector<int> ranks, int index, Communicator* comm, bool is_world)
    : name_(std::move(name)),
      key_(std::move(key)),
      axes_(std::move(axes)),
      ranks_(std::move(ranks)),
      index_(index),
      comm_(comm),
      is_world_(is_world) {}

int ProcessGroup::global_rank(int index) const {
  ZD_CHECK(index >= 0 && index < size(), "index {} outside {}", index, describe());
  return ranks_[static_cast<size_t>(index)];
}

std::string ProcessGroup::describe() const {
  return RankNames{name_, ranks_}.describe_group();
}

// ---------------------------------------------------------------------------------------------
// ProcessGroups
// ---------------------------------------------------------------------------------------------

ProcessGroups::ProcessGroups(const Mesh& mesh, int rank, Communicator* world,
                             SubCommunicatorFactory* factory, SelfCommunicator::Copy self_copy)
    : mesh_(mesh), rank_(rank), world_comm_(world), self_copy_(std::move(self_copy)) {
  const int world_size = world != nullptr ? world->size() : 1;
  ZD_CHECK(mesh_.world() == world_size,
           "the mesh ({}) has {} ranks but the world communicator has {}", mesh_.describe(),
           mesh_.world(), world_size);
  ZD_CHECK(rank >= 0 && rank < world_size, "rank {} outside a world of {}", rank, world_size);
  ZD_CHECK(world == nullptr || world->rank() == rank,
           "rank {} given, but the world communicator is rank {}", rank, world->rank());
  groups_.reserve(7);
  try {
    add("tensor", {MeshAxis::kTensor}, factory);
    add("context", {MeshAxis::kContext}, factory);
    add("data", {MeshAxis::kData}, factory);
    add("data x context", {MeshAxis::kData, MeshAxis::kContext}, factory);
    add("tensor x context", {MeshAxis::kTensor, MeshAxis::kContext}, factory);
    add("pipeline", {MeshAxis::kPipeline}, factory);
    add("tensor x pipeline", {MeshAxis::kTensor, MeshAxis::kPipeline}, factory);
    add("world", {MeshAxis::kPipeline, MeshAxis::kData, MeshAxis::kContext, MeshAxis::kTensor},
        factory);
  } catch (...) {
    groups_.clear();
    while (!owned_.empty()) owned_.pop_back();
    throw;
  }
}

ProcessGroups::~ProcessGroups() {
  groups_.clear();
  while (!owned_.empty()) owned_.pop_back();  // the last made first
}

void ProcessGroups::add(const char* name, std::initializer_list<MeshAxis> axes,
                        SubCommunicatorFactory* factory) {
  std::vector<int> ranks = mesh_.group(rank_, axes);
  const int index = mesh_.index_in_group(rank_, axes);
  std::vector<MeshAxis> sorted;
  for (MeshAxis a : kSlowToFast) {
    if (std::find(axes.begin(), axes.end(), a) != axes.end()) sorted.push_back(a);
  }
  std::string key = fmt::format("{}.{}", key_name(name), ranks.front());

  Communicator* comm = nullptr;
  bool is_world = false;
  if (static_cast<int>(ranks.size()) == mesh_.world() && world_comm_ != nullptr) {
    comm = world_comm_;  // rule 1
    is_world = true;
  } else {
    for (const ProcessGroup& g : groups_) {  // rule 2
      if (g.ranks() == ranks) {
        comm = &g.comm();
        is_world = g.is_world();
        key = g.key();
        break;
      }
    }
  }
  if (comm == nullptr && ranks.size() == 1) {  // rule 3 (also the world of one without a comm)
    const std::chrono::milliseconds timeout =
        world_comm_ != nullptr ? world_comm_->timeout() : std::chrono::minutes(5);
    owned_.push_back(std::make_unique<SelfCommunicator>(timeout, nullptr, self_copy_));
    comm = owned_.back().get();
  }
  if (comm == nullptr) {  // rule 4
    const std::string what = RankNames{name, ranks}.describe_group();
    ZD_CHECK(factory != nullptr, "{} needs a communicator, but no factory was given", what);
    std::unique_ptr<Communicator> made = factory->make(key, name, ranks, index);
    ZD_CHECK(made != nullptr, "the factory made no communicator for {}", what);
    ZD_CHECK(made->size() == static_cast<int>(ranks.size()) && made->rank() == index,
             "the factory made rank {} of {} for {}, expected rank {} of {}", made->rank(),
             made->size(), what, index, ranks.size());
    owned_.push_back(std::move(made));
    comm = owned_.back().get();
    ++made_by_factory_;
  }
  groups_.emplace_back(name, std::move(key), std::move(sorted), std::move(ranks), index, comm,
                       is_world);
  masks_.push_back(axes_mask(axes));
}

const ProcessGroup& ProcessGroups::group(std::initializer_list<MeshAxis> axes) const {
  const uint8_t mask = axes_mask(axes);
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (masks_[i] == mask) return groups_[i];
  }
  std::vector<std::string> built;
  for (const ProcessGroup& g : groups_) built.push_back(g.name());
  ZD_THROW("no process group along {}: the groups are {}", describe_axes(mask),
           fmt::join(built, ", "));
}

const ProcessGroup& ProcessGroups::world() const {
  return groups_.back();
}

}  // namespace zerod
