#include "comm/mesh.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace zerod {

const char* mesh_axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::kPipeline:
      return "pipeline";
    case MeshAxis::kData:
      return "data";
    case MeshAxis::kContext:
      return "context";
    case MeshAxis::kTensor:
      return "tensor";
  }
  return "?";
}

int MeshShape::size(MeshAxis a) const {
  switch (a) {
    case MeshAxis::kPipeline:
      return pipeline;
    case MeshAxis::kData:
      return data;
    case MeshAxis::kContext:
      return context;
    case MeshAxis::kTensor:
      return tensor;
  }
  return 1;
}

int MeshCoord::at(MeshAxis a) const {
  switch (a) {
    case MeshAxis::kPipeline:
      return pipeline;
    case MeshAxis::kData:
      return data;
    case MeshAxis::kContext:
      return context;
    case MeshAxis::kTensor:
      return tensor;
  }
  return 0;
}

namespace {
constexpr MeshAxis kSlowToFast[] = {MeshAxis::kPipeline, MeshAxis::kData, MeshAxis::kContext,
                                    MeshAxis::kTensor};

int& coord_ref(MeshCoord& c, MeshAxis a) {
  switch (a) {
    case MeshAxis::kPipeline:
      return c.pipeline;
    case MeshAxis::kData:
      return c.data;
    case MeshAxis::kContext:
      return c.context;
    case MeshAxis::kTensor:
      return c.tensor;
  }
  return c.tensor;
}

bool in(std::initializer_list<MeshAxis> axes, MeshAxis a) {
  return std::find(axes.begin(), axes.end(), a) != axes.end();
}
}  // namespace

Mesh::Mesh(MeshShape shape) : shape_(shape) {
  for (MeshAxis a : kSlowToFast) {
    ZD_CHECK_INPUT(shape_.size(a) >= 1, "the {} parallel size must be at least 1, got {}",
                   mesh_axis_name(a), shape_.size(a));
  }
}

MeshCoord Mesh::coord(int rank) const {
  ZD_CHECK(rank >= 0 && rank < world(), "rank {} outside a mesh of {}", rank, world());
  MeshCoord c;
  int r = rank;
  c.tensor = r % shape_.tensor;
  r /= shape_.tensor;
  c.context = r % shape_.context;
  r /= shape_.context;
  c.data = r % shape_.data;
  c.pipeline = r / shape_.data;
  return c;
}

int Mesh::rank(const MeshCoord& c) const {
  for (MeshAxis a : kSlowToFast) {
    ZD_CHECK(c.at(a) >= 0 && c.at(a) < shape_.size(a), "{} coordinate {} outside size {}",
             mesh_axis_name(a), c.at(a), shape_.size(a));
  }
  return ((c.pipeline * shape_.data + c.data) * shape_.context + c.context) * shape_.tensor +
         c.tensor;
}

std::vector<int> Mesh::group(int rank, std::initializer_list<MeshAxis> axes) const {
  const MeshCoord base = coord(rank);
  // Expand axis by axis, slowest first, so the fastest axis varies fastest in the result.
  std::vector<MeshCoord> coords{base};
  for (MeshAxis a : kSlowToFast) {
    if (!in(axes, a)) continue;
    std::vector<MeshCoord> next;
    for (const MeshCoord& c : coords) {
      for (int i = 0; i < shape_.size(a); ++i) {
        MeshCoord d = c;
        coord_ref(d, a) = i;
        next.push_back(d);
      }
    }
    coords = std::move(next);
  }
  std::vector<int> out;
  for (const MeshCoord& c : coords) out.push_back(this->rank(c));
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<int>> Mesh::groups(std::initializer_list<MeshAxis> axes) const {
  std::vector<std::vector<int>> out;
  std::vector<bool> seen(static_cast<size_t>(world()), false);
  for (int r = 0; r < world(); ++r) {
    if (seen[static_cast<size_t>(r)]) continue;
    out.push_back(group(r, axes));
    for (int m : out.back()) seen[static_cast<size_t>(m)] = true;
  }
  return out;
}

int Mesh::index_in_group(int rank, std::initializer_list<MeshAxis> axes) const {
  const std::vector<int> g = group(rank, axes);
  return static_cast<int>(std::find(g.begin(), g.end(), rank) - g.begin());
}

std::string Mesh::describe() const {
  return fmt::format("tensor {} x context {} x data {} x pipeline {}", shape_.tensor,
                     shape_.context, shape_.data, shape_.pipeline);
}

}  // namespace zerod
