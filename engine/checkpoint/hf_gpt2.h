// Hugging Face GPT-2 weights in and out: one safetensors file with the tensor names, shapes and
// orientation of the hub's openai-community/gpt2 model.safetensors ("wte.weight" (V, C),
// "wpe.weight" (T, C), "h.N.ln_1.weight", "h.N.attn.c_attn.weight" (C, 3C), ..., "ln_f.bias"),
// converted from and to zerod's per-unit flat fp32 buffers (model/layout.h). Conv1D weights are
// (in, out) in HF and (out, in) in zerod; HF has the V real vocabulary rows, zerod Vp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/checkpoint/safetensors.h"
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
FileChecksum export_hf_gpt2(const ParamLayout& layout,
                            const std::function<void(int unit, float* out)>& read_unit,
                            const std::string& path, DType dtype);

// Reads a GPT-2 safetensors file (names with or without the "transformer." prefix; the
// "attn.bias" / "attn.masked_bias" buffers and "lm_head.weight" are ignored; F32, BF16 or F16
// data) into zerod's layout. Every expected tensor must be present with the expected shape
// (wte rows == vocab_size; wpe rows >= seq_len, of which the first seq_len are used; every other
// shape exact) and no other tensor may be present; all problems are reported at once in one
// InputError naming the file, each tensor, the shape found and the shape expected. A file that
// carries zerod's metadata must agree on n_head. consume(u, flat) receives unit u's flat buffer
// (padding rows and alignment gaps zero), one unit at a time, in order.
void import_hf_gpt2(const std::string& path, const ParamLayout& layout,
                    const std::function<void(int unit, const float* unit_flat)>& consume);

}  // namespace zerod
