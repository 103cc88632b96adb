// Hugging Face weights in and out, converted from and to zerod's per-unit flat fp32 buffers
// (model/layout.h). GPT-2: the tensor names, shapes and orientation of the hub's
// openai-community/gpt2 model.safetensors ("wte.weight" (V, C), "wpe.weight" (T, C),
// "h.N.ln_1.weight", "h.N.attn.c_attn.weight" (C, 3C), ..., "ln_f.bias"); Conv1D weights are
// (in, out) in HF and (out, in) in zerod. Llama family: the names of save_pretrained
// ("model.embed_tokens.weight", "model.layers.N.self_attn.q_proj.weight" (out, in), ...,
// "model.norm.weight", "lm_head.weight" when untied). HF has the V real vocabulary rows, zerod Vp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/checkpoint/safetensors.h"

#include <nlohmann/json.hpp>
#include "model/layout.h"

namespace zerod {

// The metadata key under which an export records the model's shape, as a JSON string:
// {"model":"gpt2","n_layer":12,"n_head":12,"n_embd":768,"vocab_size":50257,"seq_len":1024}.
inline constexpr const char* kHfZerodMetadataKey = "zerod";

// The shape a layout tensor has in a Hugging Face file: Conv1D weights transposed, wte cut to
// the real vocabulary.
std::vector<int64_t> hf_shape(const TensorInfo& t);

// Streams a consolidated model into one safetensors file at `path` in fp32 or bf16 (round to
// nearest even), with metadata {"format": "pt", "zerod": <shape JSON>}. read_unit(u, out) fills
// unit u's flat buffer (layout.unit(u).numel floats); it is called once per unit, in order, and
// only one unit (plus a 4 MiB conversion buffer) is held at a time. The file is written to
// path + ".tmp", fsynced, renamed to path and its directory fsynced; on failure the .tmp file is
// removed. Returns the file's size and CRC32C (for a manifest). dtype kF16 is refused.
FileChecksum export_hf_safetensors(const ParamLayout& layout,
                                   const std::function<void(int unit, float* out)>& read_unit,
                                   const std::string& path, DType dtype);

// config.json for transformers' *ForCausalLM of the spec's architecture (GPT2LMHeadModel,
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM), torch_dtype from `dtype`.
nlohmann::ordered_json hf_config_json(const ModelSpec& spec, DType dtype);

struct HfDirectoryReport {
  std::vector<std::string> files;  // the weight files written, in order
  int64_t bytes = 0;               // bytes of all weight files
};

// Writes a directory AutoModelForCausalLM.from_pretrained(dir) loads with no other file:
// config.json, generation_config.json and the weights as model.safetensors, or, when they
// exceed max_shard_bytes, as model-0000K-of-0000N.safetensors shards (split between tensors, as
// transformers does: a tensor larger than the limit gets a shard of its own) with
// model.safetensors.index.json. GPT-2 tensors carry the "transformer." prefix and the tied
// lm_head.weight is written too, so a strict load_state_dict of GPT2LMHeadModel also works.
// Streams like export_hf_safetensors (one unit in memory; read_unit may be called again for the
// embedding unit). The directory appears complete or not at all (written as dir.tmp, renamed);
// an existing `dir` is replaced only with overwrite, else InputError. extra_files (the
// checkpoint's tokenizer files) are copied in by their file names, in the same all-or-nothing
// way.
HfDirectoryReport export_hf_directory(const ParamLayout& layout,
                                      const std::function<void(int unit, float* out)>& read_unit,
                                      const std::string& dir, DType dtype, int64_t max_shard_bytes,
                                      bool overwrite,
                                      const std::vector<std::string>& extra_files = {});

// The safetensors files of `path`: the file itself, or a save_pretrained directory's
// model.safetensors, or every shard its model.safetensors.index.json names (sorted). InputError
// naming the path when there is none.
std::vector<std::string> hf_weight_files(const std::string& path);

// Reads a model from a safetensors file or a Hugging Face directory (hf_weight_files). For the
// Llama family every layout tensor must be present with its HF shape (lm_head.weight is ignored
// when the embedding is tied, rotary inv_freq buffers always). GPT-2: reads a safetensors file
// (names with or without the "transformer." prefix; the "attn.bias" / "attn.masked_bias" buffers
// and "lm_head.weight" are ignored; F32, BF16 or F16 data) into zerod's layout. Every expected
// tensor must be present with the expected shape (wte rows == vocab_size; wpe rows >= seq_len, of
// which the first seq_len are used; every other shape exact) and no other tensor may be present;
// all problems are reported at once in one InputError naming the file, each tensor, the shape found
// and the shape expected. A file that carries zerod's metadata must agree on n_head. consume(u,
// flat) receives unit u's flat buffer (padding rows and alignment gaps zero), one unit at a time,
// in order.
void import_hf_model(const std::string& path, const ParamLayout& layout,
                     const std::function<void(int unit, const float* unit_flat)>& consume);

}  // namespace zerod
