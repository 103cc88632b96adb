// The model's third seam (DESIGN.md section 8), beside ParamSource and GradSink: the points where
// a tensor-parallel form of the model must combine partial results over its tensor group. The
// model calls them and knows no peers; parallel/ maps each point to a collective (Megatron's
// conjugate pairs: identity forward / all-reduce backward into a column-parallel region,
// all-reduce forward / identity backward out of a row-parallel one). A model built for one rank
// (TensorShard size 1) never calls its exchange.
#pragma once

#include <cstdint>

namespace zerod {

enum class ExchangePoint : uint8_t {
  kEmbedding,     // out of the vocabulary-parallel embedding: forward sums the partial rows
  kAttentionIn,   // into the column-parallel q/k/v: backward sums the input gradient
  kAttentionOut,  // out of the row-parallel output projection: forward sums
  kMlpIn,         // into the column-parallel up/gate (fc): backward sums
  kMlpOut,        // out of the row-parallel down projection: forward sums
  kHeadIn,        // into the vocabulary-parallel head: backward sums
};
const char* exchange_point_name(ExchangePoint p);  // "embedding", "attention_in", ...

class Exchange {
 public:
  virtual ~Exchange() = default;
  // x (n, compute dtype, the backend's memory), in place: the forward of point p.
  virtual void forward(ExchangePoint p, void* x, int64_t n) = 0;
  // dx (n, compute dtype), in place: the backward of point p.
  virtual void backward(ExchangePoint p, void* dx, int64_t n) = 0;
  // Statistics of the vocabulary-parallel cross-entropy (fp32, the backend's memory), in place:
  // the maximum, or the sum, over the tensor group.
  virtual void loss_max(float* x, int64_t n) = 0;
  virtual void loss_sum(float* x, int64_t n) = 0;
};

// One rank: every point is the identity.
class IdentityExchange final : public Exchange {
 public:
  void forward(ExchangePoint, void*, int64_t) override {}
  void backward(ExchangePoint, void*, int64_t) override {}
  void loss_max(float*, int64_t) override {}
  void loss_sum(float*, int64_t) override {}
};

}  // namespace zerod
