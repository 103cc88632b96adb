// The device mesh of a job (DESIGN.md section 8): pure arithmetic over global ranks, no
// communication. Megatron's rank order with the pipeline outermost and tensor fastest:
//
//   rank = ((pp x DP + dp) x CP + cp) x TP + tp
//
// so a tensor group is TP consecutive ranks (inside a node when TP divides the ranks per node),
// and the pipeline, which only moves boundary activations, spans the largest strides. A group
// along some axes holds the ranks that share every other coordinate; the groups along the same
// axes partition the world. Every rank computes the same groups in the same order.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

namespace zerod {

enum class MeshAxis { kPipeline, kData, kContext, kTensor };
const char* mesh_axis_name(MeshAxis a);  // "pipeline", "data", "context", "tensor"

struct MeshShape {
  int pipeline = 1, data = 1, context = 1, tensor = 1;
  int world() const { return pipeline * data * context * tensor; }
  int size(MeshAxis a) const;
  bool operator==(const MeshShape&) const = default;
};

struct MeshCoord {
  int pipeline = 0, data = 0, context = 0, tensor = 0;
  int at(MeshAxis a) const;
  bool operator==(const MeshCoord&) const = default;
};

class Mesh {
 public:
  // Every size >= 1 (InputError naming the axis otherwise).
  explicit Mesh(MeshShape shape);

  const MeshShape& shape() const { return shape_; }
  int world() const { return shape_.world(); }

  MeshCoord coord(int rank) const;
  int rank(const MeshCoord& c) const;

  // The ranks of the group along `axes` that holds `rank`, ascending (the order of their
  // coordinates along the axes, the fastest axis varying fastest).
  std::vector<int> group(int rank, std::initializer_list<MeshAxis> axes) const;
  // Every group along `axes`, ordered by their first rank: a partition of the world.
  std::vector<std::vector<int>> groups(std::initializer_list<MeshAxis> axes) const;
  // rank's index inside its group along `axes`.
  int index_in_group(int rank, std::initializer_list<MeshAxis> axes) const;

  // "tp 2 x cp 1 x dp 4 x pp 1" style description of the shape.
  std::string describe() const;

 private:
  MeshShape shape_;
};

}  // namespace zerod
