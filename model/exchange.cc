#include "model/exchange.h"

#include "core/error.h"

namespace zerod {

const char* exchange_point_name(ExchangePoint p) {
  switch (p) {
    case ExchangePoint::kEmbedding:
      return "embedding";
    case ExchangePoint::kAttentionIn:
      return "attention_in";
    case ExchangePoint::kAttentionOut:
      return "attention_out";
    case ExchangePoint::kMlpIn:
      return "mlp_in";
    case ExchangePoint::kMlpOut:
      return "mlp_out";
    case ExchangePoint::kHeadIn:
      return "head_in";
  }
  return "?";
}

bool exchange_sums_forward(ExchangePoint p) {
  return p == ExchangePoint::kEmbedding || p == ExchangePoint::kAttentionOut ||
         p == ExchangePoint::kMlpOut;
}

void Exchange::attention_forward(void*, float*, const void*, const AttentionShape&) {
  ZD_THROW("context-parallel attention on an exchange without a context group");
}

void Exchange::attention_backward(void*, const void*, const void*, const void*, const float*,
                                  const AttentionShape&) {
  ZD_THROW("context-parallel attention on an exchange without a context group");
}

}  // namespace zerod
