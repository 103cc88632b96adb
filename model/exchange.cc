#include "model/exchange.h"

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

}  // namespace zerod
