// The seams of one chunk's model on an interleaved pipeline rank (DESIGN.md section 8): a rank
// holding V stages builds a model per stage, each with its own single-stage layout (units
// 0..n-1), while its ZeRO engine holds the rank's layout of every chunk (ParamLayout with
// chunks). ChunkSeams forwards a chunk model's ParamSource and GradSink calls to the rank's,
// mapping the chunk's unit indices to the rank's through their global units.
#pragma once

#include <vector>

#include "model/layout.h"
#include "model/param_source.h"

namespace zerod::pipeline {

class ChunkSeams : public ParamSource, public GradSink {
 public:
  // chunk: the chunk model's layout; rank: the rank's (every unit of chunk must be in it, Error
  // otherwise). The rank's seams are set per call (bind).
  ChunkSeams(const ParamLayout& chunk, const ParamLayout& rank);

  void bind(ParamSource* params, GradSink* grads) {
    params_ = params;
    grads_ = grads;
  }
  int rank_unit(int u) const { return map_[static_cast<size_t>(u)]; }

  const void* acquire(int unit) override { return params_->acquire(rank_unit(unit)); }
  void release(int unit) override { params_->release(rank_unit(unit)); }
  void prefetch(int unit) override { params_->prefetch(rank_unit(unit)); }
  void* grad_buffer(int unit) override { return grads_->grad_buffer(rank_unit(unit)); }
  void unit_done(int unit) override { grads_->unit_done(rank_unit(unit)); }

 private:
  std::vector<int> map_;  // chunk unit -> rank unit
  ParamSource* params_ = nullptr;
  GradSink* grads_ = nullptr;
};

}  // namespace zerod::pipeline
