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

int64_t split_backward_bytes(const ModelSpec& spec, int B, int T, size_t esz, int tensor_parallel,
                             LayerRange stage) {
  const LocalDims d = local_dims(spec, TensorShard{0, tensor_parallel, false});
  if (stage.end < 0) stage.end = spec.n_layer;
  const int64_t N = int64_t{B} * T, C = spec.n_embd, n = stage.end - stage.begin;
  // Per block, (dout + input) columns of each matmul: qkv, attention output, MLP in, MLP out.
  const int64_t block =
      spec.llama_family() ? (d.qkv_dim + C) + (C + d.q_dim) + (2 * int64_t{d.ffn} + C) + (C + d.ffn)
                          : (3 * int64_t{d.q_dim} + C) + (C + d.q_dim) + (d.ffn + C) + (C + d.ffn);
  const int64_t head = stage.end == spec.n_layer ? C : 0;
  return (n * block + head) * N * static_cast<int64_t>(esz);
}

}  // namespace zerod
