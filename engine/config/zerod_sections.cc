// zerod's own sections: "model", "data", "train", and "resolved" (the derived values job_to_json
// prints, accepted back so that its output is itself a valid job file).
#include <fmt/format.h>

#include <algorithm>

#include "engine/config/sections.h"

namespace zerod::config {

namespace {

// A glob string or an array of glob strings.
void read_globs(ObjectReader& r, const char* key, std::vector<std::string>& out) {
  const Json* v = r.find(key);
  if (v == nullptr || v->is_null()) return;
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().empty()) {
      r.problems().error(r.path_of(key), "must not be empty");
      return;
    }
    out = {v->get<std::string>()};
    return;
  }
  bool ok = v->is_array();
  if (ok) {
    for (const Json& g : *v) ok = ok && g.is_string() && !g.get_ref<const std::string&>().empty();
  }
  if (!ok) {
    r.type_error(r.path_of(key), "a glob string or an array of non-empty glob strings", *v);
    return;
  }
  out = v->get<std::vector<std::string>>();
}

// data.train: globs (read_globs), or a blend: an array of {"path": GLOB, "weight": W > 0}.
void read_train_sources(ObjectReader& r, DataConfig& d) {
  const Json* v = r.find("train");
  const bool blend = v != nullptr && v->is_array() && !v->empty() &&
                     std::any_of(v->begin(), v->end(), [](const Json& e) { return e.is_object(); });
  if (!blend) {
    read_globs(r, "train", d.train);
    return;
  }
  std::vector<std::string> globs;
  std::vector<double> weights;
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& e = (*v)[i];
    const std::string where = fmt::format("{}[{}]", r.path_of("train"), i);
    if (!e.is_object()) {
      r.type_error(where, "{\"path\": GLOB, \"weight\": W} (a blend lists only such objects)", e);
      return;
    }
    ObjectReader item(e, where, r.problems());
    std::string path;
    double weight = 0.0;
    if (!item.has("path")) r.problems().error(item.path_of("path"), "required (a glob of shards)");
    if (!item.has("weight")) r.problems().error(item.path_of("weight"), "required (a number > 0)");
    const bool got_path = item.read_string("path", path, /*allow_empty=*/false);
    const bool got_weight = item.read_real("weight", weight, real_above(0.0));
    item.finish();
    if (!got_path || !got_weight) return;
    globs.push_back(path);
    weights.push_back(weight);
  }
  d.train = std::move(globs);
  d.train_weights = std::move(weights);
}

}  // namespace

void read_data(ObjectReader& top, JobConfig& cfg) {
  const Json* obj = top.read_object("data");
  if (obj == nullptr) return;
  DataConfig& d = cfg.data;
  ObjectReader r(*obj, "data", top.problems());
  read_train_sources(r, d);
  read_globs(r, "val", d.val);
  r.read_string("tokenizer", d.tokenizer, /*allow_empty=*/false);
  r.read_real("val_fraction", d.val_fraction, real_between(0.0, 1.0, /*max_open=*/true));
  r.read_u64("seed", d.seed);
  r.read_bool("shuffle", d.shuffle);
  r.read_bool("document_masking", d.document_masking);
  r.read_opt_int("eos_token_id", d.eos_token_id, at_least(0));
  r.finish();
}

void read_train(ObjectReader& top, JobConfig& cfg) {
  const Json* raw = top.find("train");
  if (raw == nullptr || raw->is_null()) {
    top.problems().error("train", "required (at least {\"steps\": N})");
    return;
  }
  const Json* obj = top.read_object("train");  // a non-object is reported here
  if (obj == nullptr) return;
  TrainConfig& t = cfg.train;
  ObjectReader r(*obj, "train", top.problems());
  if (!r.has("steps")) top.problems().error("train.steps", "required (optimizer steps to run)");
  r.read_int("steps", t.steps, at_least(1));
  size_t device = 0;
  if (r.read_choice("device", device, {"cpu", "cuda"}, /*case_insensitive=*/false))
    t.device = device == 1 ? TrainDevice::kCuda : TrainDevice::kCpu;
  size_t comm = 0;
  if (r.read_choice("device_comm", comm, {"auto", "nccl", "gloo"}, /*case_insensitive=*/false))
    t.device_comm = static_cast<DeviceComm>(comm);
  r.read_string("checkpoint_dir", t.checkpoint_dir);
  r.read_int("save_interval", t.save_interval, at_least(0));
  r.read_int("keep_last", t.keep_last, at_least(0));
  r.read_int("eval_interval", t.eval_interval, at_least(0));
  r.read_int("eval_batches", t.eval_batches, at_least(1));
  r.read_u64("seed", t.seed);
  r.read_real("peak_flops", t.peak_flops, real_at_least(0.0));
  r.read_int("memory_limit", t.memory_limit, at_least(0));
  r.read_real("collective_timeout", t.collective_timeout, real_above(0.0));
  r.read_real("rendezvous_timeout", t.rendezvous_timeout, real_above(0.0));
  r.read_bool("allow_batch_change", t.allow_batch_change);
  r.finish();
}

void read_resolved(ObjectReader& top, JobConfig& cfg) {
  const Json* obj = top.read_object("resolved");
  if (obj == nullptr) return;
  Problems& problems = top.problems();
  ObjectReader r(*obj, "resolved", problems);
  r.read_int("world_size", cfg.world_size, int_between(1, 1 << 24));
  auto expect = [&](const char* key, const Json& derived) {
    const Json* v = r.find(key);
    if (v != nullptr && *v != derived) {
      problems.error(r.path_of(key),
                     fmt::format("{} does not match the value derived from this file ({}); fix or "
                                 "remove it",
                                 show(*v), show(derived)));
    }
  };
  expect("compute_dtype", std::string(dtype_name(cfg.compute_dtype())));
  expect("padded_vocab_size", cfg.model.padded_vocab_size);
  expect("overlap_comm", cfg.zero.overlap_comm_resolved);
  const int model_ranks = cfg.parallelism.model_ranks();
  if (cfg.world_size % model_ranks == 0) {
    cfg.data_parallel_size = cfg.world_size / model_ranks;
    expect("data_parallel_size", cfg.data_parallel_size);
    expect("layout", rank_layout_json(cfg));
  } else {
    r.find("data_parallel_size");
    r.find("layout");
    problems.error("resolved.world_size", fmt::format("{} is not divisible by {}", cfg.world_size,
                                                      model_ranks_text(cfg.parallelism)));
  }
  r.finish();
}

}  // namespace zerod::config
