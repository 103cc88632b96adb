// Whole units of a checkpoint's optimizer states, whatever tensor-parallel size saved it
// (DESIGN.md section 8: one pure mapping from any saved mesh to any loading mesh, at load time).
//
// A checkpoint saved at T = 1 holds slices of whole units; one saved at T > 1 holds, per tensor
// rank, slices of that rank's part of each unit (manifest tensor_parallel and files[].tensor_rank).
// read_global() gives the whole unit (the tensor ranks' parts put back with unshard_unit);
// read_local() gives any rank's part of any T (shard_unit of the whole unit, or straight from
// the files when the checkpoint has the same T). Data-parallel resharding (any world size and
// ZeRO stage) comes from ShardReader underneath.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint/manifest.h"
#include "engine/checkpoint/shard_io.h"
#include "model/layout.h"

namespace zerod {

class UnitReader {
 public:
  // spec: the saved model (its layout at the manifest's T must be the manifest's units: names
  // and sizes, else InputError naming the manifest). Keeps references to nothing but its copies.
  UnitReader(std::string path, const Manifest& manifest, const ModelSpec& spec);
  ~UnitReader();

  // The tensor-parallel size the checkpoint was saved at.
  int saved_tensor_parallel() const { return saved_tp_; }
  // The whole unit u (global layout): each pointer (may be null) gets its numel floats.
  void read_global(int u, float* master, float* exp_avg, float* exp_avg_sq);
  // Unit u of `local` (a tensor rank's layout of the same model, any T, holding some of the
  // experts or all): local.unit(u).numel floats per pointer (may be null).
  void read_local(const ParamLayout& local, int u, float* master, float* exp_avg,
                  float* exp_avg_sq);

 private:
  std::string path_;
  int saved_tp_;
  ParamLayout global_;
  std::vector<std::unique_ptr<Manifest>> parts_;     // per saved tensor rank: its files only
  std::vector<std::unique_ptr<ParamLayout>> saved_;  // per saved tensor rank: its layout
  std::vector<std::unique_ptr<ShardReader>> readers_;
};

// The manifest restricted to the files of tensor rank `tensor_rank` (all of them at T = 1).
Manifest tensor_rank_manifest(const Manifest& m, int tensor_rank);

}  // namespace zerod
