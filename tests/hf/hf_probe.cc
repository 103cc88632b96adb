// zerod_hf_probe: runs one zerod model on the weights of a Hugging Face directory for the
// transformers parity test (tests/hf/parity.py), with no trainer around it.
//
//   zerod_hf_probe --from DIR --tokens FILE --batch B --seq T --out OUT.safetensors
//                  [--dtype fp32|bf16]
//
// The model's shape comes from DIR/config.json through the job parser (as `model.init_from`
// does), the weights through import_hf_model. FILE holds B*(T+1) int32 tokens: inputs are each
// row's first T, targets its last T. The probe runs forward (logits) and then forward_backward
// with loss weight 1 and writes OUT with "loss" (1), "logits" (B,T,V) and "grad.<HF name>" for
// every parameter in Hugging Face's shape and orientation; a MoE model also "aux_loss" (1) and
// "z_loss" (1), the router losses of that forward_backward (whose gradient includes them with
// the model's coefficients).
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/checkpoint/hf_model.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/config/model_spec.h"
#include "engine/config/parse.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace zerod {
namespace {

class FullStates : public ParamSource, public GradSink {
 public:
  FullStates(const ParamLayout& layout, Backend& be) {
    for (int u = 0; u < layout.num_units(); ++u) {
      weights.emplace_back(layout.unit(u).numel);
      grads.emplace_back(layout.unit(u).numel, 0.0f);
    }
    (void)be;
  }
  const void* acquire(int u) override { return weights[u].data(); }
  void release(int) override {}
  void* grad_buffer(int u) override { return grads[u].data(); }
  void unit_done(int) override {}
  std::vector<std::vector<float>> weights, grads;
};

int run(int argc, char** argv) {
  std::string from, tokens_file, out, dtype = "fp32";
  int B = 0, T = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--from") from = v;
    else if (k == "--tokens") tokens_file = v;
    else if (k == "--out") out = v;
    else if (k == "--dtype") dtype = v;
    else if (k == "--batch") B = std::stoi(v);
    else if (k == "--seq") T = std::stoi(v);
    else ZD_THROW_INPUT("unknown option {}", k);
  }
  ZD_CHECK_INPUT(!from.empty() && !tokens_file.empty() && !out.empty() && B > 0 && T > 0,
                 "usage: zerod_hf_probe --from DIR --tokens FILE --batch B --seq T --out FILE");
  const nlohmann::json job = {{"model", {{"init_from", from}, {"seq_len", T}}},
                              {"train", {{"steps", 1}}}};
  ParsedJob parsed = parse_job_text(job.dump(), "probe");
  const ModelSpec spec = model_spec(parsed.config.model);
  auto backend = make_cpu_backend(dtype == "bf16" ? DType::kBF16 : DType::kF32);
  auto model = make_model(spec, *backend, B, T, false, nullptr);
  const ParamLayout& layout = model->layout();
  FullStates states(layout, *backend);
  import_hf_model(from, layout, [&](int u, const float* flat) {
    backend->cast_to_compute(states.weights[u].data(), flat, layout.unit(u).numel);
  });

  std::vector<int32_t> rows(static_cast<size_t>(B) * (T + 1));
  std::ifstream in(tokens_file, std::ios::binary);
  in.read(reinterpret_cast<char*>(rows.data()), static_cast<std::streamsize>(rows.size() * 4));
  ZD_CHECK_INPUT(in.gcount() == static_cast<std::streamsize>(rows.size() * 4),
                 "{}: expected {} int32 tokens", tokens_file, rows.size());
  std::vector<int32_t> inputs, targets;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      inputs.push_back(rows[static_cast<size_t>(b) * (T + 1) + t]);
      targets.push_back(rows[static_cast<size_t>(b) * (T + 1) + t + 1]);
    }

  const int V = spec.vocab_size, Vp = spec.vp();
  model->forward(inputs.data(), targets.data(), states);
  std::vector<float> logits_p(static_cast<size_t>(B) * T * Vp);
  model->read_logits(logits_p.data());
  std::vector<float> logits;
  for (int64_t r = 0; r < int64_t{B} * T; ++r)
    logits.insert(logits.end(), logits_p.begin() + r * Vp, logits_p.begin() + r * Vp + V);
  const float loss = model->forward_backward(inputs.data(), targets.data(), states, states, 1.0f);

  // Mixture of experts: the router's load-balancing and z losses of that forward_backward.
  const MoeStepStats moe = model->moe_stats();
  const float aux_loss = static_cast<float>(moe.aux_loss), z_loss = static_cast<float>(moe.z_loss);
  std::vector<SafetensorsWriter::Entry> entries = {{"loss", StDType::kF32, {1}},
                                                   {"logits", StDType::kF32, {B, T, V}}};
  if (spec.moe.enabled()) {
    entries.push_back({"aux_loss", StDType::kF32, {1}});
    entries.push_back({"z_loss", StDType::kF32, {1}});
  }
  for (int u = 0; u < layout.num_units(); ++u)
    for (const TensorInfo& t : layout.unit(u).tensors)
      entries.push_back({"grad." + t.name, StDType::kF32, hf_shape(t)});
  SafetensorsWriter w(out, entries);
  w.write("loss", &loss, sizeof(float));
  w.write("logits", logits.data(), logits.size() * sizeof(float));
  if (spec.moe.enabled()) {
    w.write("aux_loss", &aux_loss, sizeof(float));
    w.write("z_loss", &z_loss, sizeof(float));
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> g(states.grads[u].size());
    backend->cast_from_compute(g.data(), states.grads[u].data(), static_cast<int64_t>(g.size()));
    for (const TensorInfo& t : layout.unit(u).tensors) {
      ZD_CHECK(!t.hf_transposed, "the probe writes Llama-family gradients ({})", t.name);
      const int64_t n = t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
      w.write("grad." + t.name, g.data() + t.offset, static_cast<size_t>(n) * sizeof(float));
    }
  }
  w.finish();
  std::printf("loss %.7f\n", loss);
  return 0;
}

}  // namespace
}  // namespace zerod

int main(int argc, char** argv) {
  try {
    return zerod::run(argc, argv);
  } catch (const zerod::InputError& e) {
    std::fprintf(stderr, "zerod_hf_probe: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerod_hf_probe: %s\n", e.what());
    return 1;
  }
}
