#include "model/gpt.h"
#include "model/llama.h"
#include "model/model.h"

namespace zerod {

std::unique_ptr<Model> make_model(const ModelSpec& spec, Backend& backend, int B, int T,
                                  bool activation_checkpointing, MemoryTracker* tracker,
                                  TensorShard shard, ContextShard context, LayerRange stage,
                                  int slots) {
  if (spec.llama_family()) {
    return std::make_unique<Llama>(spec, backend, B, T, activation_checkpointing, tracker, shard,
                                   context, stage, slots);
  }
  return std::make_unique<Gpt>(spec, backend, B, T, activation_checkpointing, tracker, shard,
                               context, stage, slots);
}

int64_t model_activation_bytes(const ModelSpec& spec, int B, int T, bool activation_checkpointing,
                               size_t esz, int tensor_parallel, bool sequence_parallel,
                               int context_parallel, LayerRange stage, int slots) {
  const TensorShard shard{0, tensor_parallel, sequence_parallel};
  if (spec.llama_family())
    return Llama::activation_bytes(spec, shard, B, T, activation_checkpointing, esz,
                                   context_parallel, stage, slots);
  return Gpt::activation_bytes(spec, shard, B, T, activation_checkpointing, esz, context_parallel,
                               stage, slots);
}

}  // namespace zerod
