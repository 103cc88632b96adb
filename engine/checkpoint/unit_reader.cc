#include "engine/checkpoint/unit_reader.h"

#include <algorithm>

#include "core/error.h"
#include "model/shard.h"

namespace zerod {

Manifest tensor_rank_manifest(const Manifest& m, int tensor_rank) {
  Manifest out = m;
  std::erase_if(out.files, [&](const CheckpointFile& f) { return f.tensor_rank != tensor_rank; });
  return out;
}

UnitReader::UnitReader(std::string path, const Manifest& manifest, const ModelSpec& spec)
    : path_(std::move(path)), saved_tp_(manifest.tensor_parallel), global_(spec) {
  const std::string where = path_ + "/manifest.json";
  const std::string problem = tensor_parallel_problem(spec, saved_tp_);
  if (!problem.empty())
    ZD_THROW_INPUT("{}: saved at tensor_parallel {}, but {}", where, saved_tp_, problem);
  for (int r = 0; r < saved_tp_; ++r) {
    saved_.push_back(
        std::make_unique<ParamLayout>(spec, global_.align_elems(), TensorShard{r, saved_tp_}));
  }
  // The manifest's units must be the layout this build derives from the shape it records.
  const ParamLayout& part = *saved_[0];
  if (static_cast<int>(manifest.units.size()) != part.num_units()) {
    ZD_THROW_INPUT("{}: {} units, but a model of this shape has {}", where, manifest.units.size(),
                   part.num_units());
  }
  for (int u = 0; u < part.num_units(); ++u) {
    const UnitShape& us = manifest.units[static_cast<size_t>(u)];
    if (us.name != part.unit(u).name || us.numel != part.unit(u).numel) {
      ZD_THROW_INPUT("{}: units[{}] is {} ({} elements), expected {} ({} elements{})", where, u,
                     us.name, us.numel, part.unit(u).name, part.unit(u).numel,
                     saved_tp_ > 1 ? fmt::format(" per tensor rank of {}", saved_tp_) : "");
    }
  }
  for (int r = 0; r < saved_tp_; ++r) {
    parts_.push_back(std::make_unique<Manifest>(tensor_rank_manifest(manifest, r)));
    readers_.push_back(std::make_unique<ShardReader>(path_, *parts_.back()));
  }
}

UnitReader::~UnitReader() = default;

void UnitReader::read_global(int u, float* master, float* exp_avg, float* exp_avg_sq) {
  const int64_t n = global_.unit(u).numel;
  if (saved_tp_ == 1) {
    readers_[0]->read(u, 0, n, master, exp_avg, exp_avg_sq);
    return;
  }
  float* outs[3] = {master, exp_avg, exp_avg_sq};
  for (float* o : outs)
    if (o) std::fill(o, o + n, 0.0f);
  std::vector<float> part[3];
  for (int r = 0; r < saved_tp_; ++r) {
    const ParamLayout& l = *saved_[static_cast<size_t>(r)];
    const int64_t ln = l.unit(u).numel;
    for (int k = 0; k < 3; ++k)
      if (outs[k]) part[k].assign(static_cast<size_t>(ln), 0.0f);
    readers_[static_cast<size_t>(r)]->read(u, 0, ln, master ? part[0].data() : nullptr,
                                           exp_avg ? part[1].data() : nullptr,
                                           exp_avg_sq ? part[2].data() : nullptr);
    for (int k = 0; k < 3; ++k)
      if (outs[k]) unshard_unit(global_, l, u, part[k].data(), outs[k]);
  }
}

void UnitReader::read_local(const ParamLayout& local, int u, float* master, float* exp_avg,
                            float* exp_avg_sq) {
  const TensorShard& s = local.shard();
  // A pipeline stage's unit u is the whole model's unit g.
  const int g = local.global_unit(u);
  if (s.expert_size > 1) {
    // This rank's experts: a range of the unit of every expert (ParamLayout::experts_offset);
    // its other units are those of every expert's layout.
    const ParamLayout all(local.spec(), local.align_elems(), s.all_experts());
    if (!local.unit(u).experts) return read_local(all, g, master, exp_avg, exp_avg_sq);
    const int64_t off = local.experts_offset(), n = local.unit(u).numel;
    float* outs[3] = {master, exp_avg, exp_avg_sq};
    std::vector<float> whole[3];
    for (int k = 0; k < 3; ++k)
      if (outs[k]) whole[k].resize(static_cast<size_t>(all.unit(g).numel));
    read_local(all, g, master ? whole[0].data() : nullptr, exp_avg ? whole[1].data() : nullptr,
               exp_avg_sq ? whole[2].data() : nullptr);
    for (int k = 0; k < 3; ++k)
      if (outs[k]) std::copy(whole[k].begin() + off, whole[k].begin() + off + n, outs[k]);
    return;
  }
  if (s.size == saved_tp_) {
    readers_[static_cast<size_t>(s.rank)]->read(g, 0, local.unit(u).numel, master, exp_avg,
                                                exp_avg_sq);
    return;
  }
  if (!local.whole_model()) {
    const ParamLayout whole(local.spec(), local.align_elems(), s);
    read_local(whole, g, master, exp_avg, exp_avg_sq);
    return;
  }
  const int64_t n = global_.unit(u).numel;
  float* outs[3] = {master, exp_avg, exp_avg_sq};
  std::vector<float> whole[3];
  for (int k = 0; k < 3; ++k)
    if (outs[k]) whole[k].resize(static_cast<size_t>(n));
  read_global(u, master ? whole[0].data() : nullptr, exp_avg ? whole[1].data() : nullptr,
              exp_avg_sq ? whole[2].data() : nullptr);
  for (int k = 0; k < 3; ++k)
    if (outs[k]) shard_unit(global_, local, u, whole[k].data(), outs[k]);
}

}  // namespace zerod
