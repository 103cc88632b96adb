// The GPU paths of the model, the ZeRO engine and the checkpointer, checked on the CPU: the
// StrictDeviceBackend computes with the CPU kernels but page-protects the memory it allocates, so
// any host access to "device" memory outside copy() and the casts crashes the test. Every ZeRO
// stage and offload setting trains a few steps at world 1 (GPT-2, Llama, Mistral) and must give
// the plain CPU backend's losses and master weights bit for bit, through the paths a GPU run
// takes (tokens uploaded, losses read back, states staged through host memory, CPU Adam for
// offloaded states, the self communicator's copies through the backend).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "engine/config/model_spec.h"
#include "engine/train/checkpointer.h"
#include "model/model.h"
#include "tests/unit/engine/train/strict_device_backend.h"
#include "tests/unit/engine/train/train_test_util.h"
#include "zero/zero_engine.h"

namespace zerod::test {
namespace {

namespace fs = std::filesystem;

// GPT-2; a Llama with grouped-query attention and an untied output head; a Mistral with a tied
// one and a sliding window shorter than the sequence.
ModelSpec tiny_spec(ModelArch arch) {
  ModelSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 32;
  s.vocab_size = 70;
  s.seq_len = 16;
  if (s.llama_family()) {
    s.n_head = 4;
    s.n_kv_head = 2;
    s.intermediate_size = 48;
    s.tie_word_embeddings = arch == ModelArch::kMistral;
    if (arch == ModelArch::kMistral) s.sliding_window = 6;
  }
  return s;
}

constexpr int kB = 2, kT = 16, kSteps = 3;

struct Trained {
  std::vector<float> losses;
  std::vector<double> grad_norms;
  std::vector<float> master;  // every unit's shard, after the last step
};

// Trains kSteps steps of the same 2 micro-batches of random tokens.
Trained train(Backend& be, const ZeroOptions& zo, ModelArch arch) {
  MemoryTracker memory;
  const std::unique_ptr<Model> made =
      make_model(tiny_spec(arch), be, kB, kT, /*activation_checkpointing=*/false, &memory);
  Model& model = *made;
  ZeroEngine engine(model.layout(), be, zo, &memory);
  engine.init_weights(7);
  Trained run;
  std::vector<int32_t> inputs(kB * kT), targets(kB * kT);
  for (int step = 1; step <= kSteps; ++step) {
    Rng rng(11);  // the same two micro-batches every step: a loss that falls
    engine.zero_grad();
    double loss = 0;
    for (int micro = 0; micro < 2; ++micro) {
      engine.begin_micro_batch(micro == 1);
      for (size_t i = 0; i < inputs.size(); ++i) {
        inputs[i] = static_cast<int32_t>(rng.uniform(70));
        targets[i] = static_cast<int32_t>(rng.uniform(70));
      }
      targets[3] = -1;  // a position without loss
      loss += model.forward_backward(inputs.data(), targets.data(), engine, engine, 0.5f);
    }
    OptimStep os;
    os.lr = 1e-2;
    os.weight_decay = 0.1;
    os.max_grad_norm = 1.0;
    const StepResult r = engine.step(os);
    run.losses.push_back(static_cast<float>(loss / 2));
    run.grad_norms.push_back(r.grad_norm);
  }
  engine.visit_states_host(ZeroEngine::StatesMode::kRead, 0, model.layout().num_units(),
                           [&](int, int64_t lo, int64_t hi, float* pm, float*, float*) {
                             run.master.insert(run.master.end(), pm, pm + (hi - lo));
                           });
  // The evaluation path (forward only) reads its losses back as well.
  run.losses.push_back(model.forward(inputs.data(), targets.data(), engine));
  return run;
}

struct Case {
  const char* name;
  int stage;
  StatesHome optimizer = StatesHome::kDevice;
  StatesHome params = StatesHome::kDevice;
  double ratio = 1.0;
};

class DeviceMemory : public ::testing::TestWithParam<std::tuple<DType, ModelArch>> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zerod_device_memory_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  ZeroOptions options(const Case& c) const {
    ZeroOptions zo;
    zo.stage = c.stage;
    zo.optimizer_states = c.optimizer;
    zo.offload_ratio = c.ratio;
    zo.param_states = c.params;
    zo.reduce_bucket_size = 3000;  // several buckets
    zo.param_persistence_threshold = 0;
    if (c.optimizer == StatesHome::kNvme) {
      zo.swap_path = (dir_ / "opt.swp").string();
      zo.swap.group_elems = 2048;  // several sub-groups
      zo.swap.buffer_count = 2;
      zo.swap.pipeline_read = zo.swap.pipeline_write = true;
    }
    if (c.params == StatesHome::kNvme) {
      zo.param_swap_path = (dir_ / "param.swp").string();
      zo.param_max_in_cpu = 3000;  // the leading units in memory, the rest on disk
    }
    return zo;
  }

  fs::path dir_;
};

TEST_P(DeviceMemory, EveryStageAndOffloadMatchesTheCpuBackendBitForBit) {
  const auto [dtype, arch] = GetParam();
  const Case cases[] = {
      {"stage 0", 0},
      {"stage 1", 1},
      {"stage 2", 2},
      {"stage 3", 3},
      {"stage 1, optimizer on cpu", 1, StatesHome::kHost},
      {"stage 3, optimizer on cpu, ratio 0.5", 3, StatesHome::kHost, StatesHome::kDevice, 0.5},
      {"stage 2, optimizer on nvme", 2, StatesHome::kNvme},
      {"stage 3, parameters on cpu", 3, StatesHome::kDevice, StatesHome::kHost},
      {"stage 3, parameters on nvme", 3, StatesHome::kDevice, StatesHome::kNvme},
      {"stage 3, everything on nvme", 3, StatesHome::kNvme, StatesHome::kNvme},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Backend> cpu = make_cpu_backend(dtype);
    const Trained want = train(*cpu, options(c), arch);
    StrictDeviceBackend strict(dtype);
    const Trained got = train(strict, options(c), arch);
    ASSERT_EQ(got.losses.size(), want.losses.size());
    for (size_t i = 0; i < want.losses.size(); ++i) {
      EXPECT_EQ(got.losses[i], want.losses[i]) << "loss " << i;
    }
    EXPECT_EQ(got.grad_norms, want.grad_norms);
    ASSERT_EQ(got.master.size(), want.master.size());
    size_t differ = 0;
    for (size_t i = 0; i < want.master.size(); ++i) differ += got.master[i] != want.master[i];
    EXPECT_EQ(differ, 0u) << "of " << want.master.size() << " master weights";
    EXPECT_GT(want.losses[0], want.losses[kSteps - 1]) << "the model learns";
    // Which optimizer ran: the device's for states in device memory, CPU Adam on the host for
    // offloaded ones (all of them, or the half beyond the ratio on the device).
    if (c.optimizer == StatesHome::kDevice || c.ratio < 1) {
      EXPECT_GT(strict.device_adam(), 0);
    } else {
      EXPECT_EQ(strict.device_adam(), 0);
    }
    EXPECT_GT(strict.copies(), 0);
    // The swappers' host buffers are registered with the device while they live.
    const bool nvme = c.optimizer == StatesHome::kNvme || c.params == StatesHome::kNvme;
    EXPECT_EQ(strict.registrations() > 0, nvme);
    EXPECT_EQ(strict.registered_now(), 0u);
  }
  EXPECT_EQ(StrictDeviceBackend::mapped_bytes(), 0u) << "every device buffer was freed";
}

// GPT-2 in both dtypes; the Llama family in one each (every case takes seconds on 2 cores).
INSTANTIATE_TEST_SUITE_P(DtypesAndModels, DeviceMemory,
                         ::testing::Values(std::make_tuple(DType::kF32, ModelArch::kGpt2),
                                           std::make_tuple(DType::kBF16, ModelArch::kGpt2),
                                           std::make_tuple(DType::kBF16, ModelArch::kLlama),
                                           std::make_tuple(DType::kF32, ModelArch::kMistral)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  model_arch_name(std::get<1>(info.param));
                         });

// The backend really does catch host access to its memory (the premise of the test above).
TEST(StrictDeviceBackend, HostAccessToItsMemoryCrashes) {
  StrictDeviceBackend be(DType::kF32);
  Buffer b = be.allocate(64, MemCategory::kOther, nullptr);
  float one = 1.0f, back = 0.0f;
  be.copy(b.data(), &one, sizeof(float));
  be.copy(&back, b.data(), sizeof(float));
  EXPECT_EQ(back, 1.0f);
  EXPECT_DEATH(
      {
        volatile float* p = b.as<float>();
        p[0] = 2.0f;
      },
      "");
}

// Checkpoints of states in (strict) device memory, saved synchronously and asynchronously, load
// back bit for bit, into device memory and into the CPU backend.
TEST(DeviceMemoryCheckpoint, SavesAndLoadsStatesInDeviceMemory) {
  testing::TempCorpus corpus("zerod_device_ckpt");
  for (const bool async : {false, true}) {
    for (const int stage : {0, 3}) {
      SCOPED_TRACE(fmt::format("async {} stage {}", async, stage));
      const std::string dir = (corpus.dir() / fmt::format("ck_{}_{}", async, stage)).string();
      JobConfig cfg = testing::tiny_job(corpus, 1, stage, 1, 2, R"(, "bf16": {"enabled": true})",
                                        R"(, "checkpoint_dir": ")" + dir + R"(")");
      cfg.checkpoint.async = async;
      const ModelSpec spec = model_spec(cfg.model);
      ZeroOptions zo;
      zo.stage = stage;
      auto masters = [](ZeroEngine& e) {  // master, exp_avg, exp_avg_sq of every piece
        std::vector<float> all;
        e.visit_states_host(ZeroEngine::StatesMode::kRead, 0, e.layout().num_units(),
                            [&](int, int64_t lo, int64_t hi, float* pm, float* pa, float* pv) {
                              all.insert(all.end(), pm, pm + (hi - lo));
                              all.insert(all.end(), pa, pa + (hi - lo));
                              all.insert(all.end(), pv, pv + (hi - lo));
                            });
        return all;
      };
      std::vector<float> saved;
      {
        StrictDeviceBackend be(DType::kBF16);
        MemoryTracker memory;
        const ParamLayout layout(spec);
        ZeroEngine engine(layout, be, zo, &memory);
        engine.init_weights(5);
        // Moments that differ from the master: set them through the host view.
        engine.visit_states_host(ZeroEngine::StatesMode::kUpdate, 0, layout.num_units(),
                                 [](int u, int64_t lo, int64_t hi, float*, float* pa, float* pv) {
                                   for (int64_t i = 0; i < hi - lo; ++i) {
                                     pa[i] = 0.001f * static_cast<float>(u + i);
                                     pv[i] = 0.002f * static_cast<float>(u * i % 97);
                                   }
                                 });
        engine.set_adam_steps(3);
        Checkpointer ckpt(cfg, RankContext{}, engine, &memory);
        TrainingProgress progress;
        progress.global_step = 3;
        progress.adam_steps = 3;
        const SaveReport r = ckpt.save("t", progress);
        EXPECT_EQ(r.committed, !async);
        saved = masters(engine);
        // Async: what the writer writes is the copy taken in save(); change the states now.
        engine.visit_states_host(ZeroEngine::StatesMode::kUpdate, 0, layout.num_units(),
                                 [&](int, int64_t lo, int64_t hi, float* pm, float*, float*) {
                                   std::fill(pm, pm + (hi - lo), 9.0f);
                                 });
        EXPECT_EQ(ckpt.finish().has_value(), async);
      }
      for (const bool strict : {true, false}) {
        std::unique_ptr<Backend> be;
        if (strict) {
          be = std::make_unique<StrictDeviceBackend>(DType::kBF16);
        } else {
          be = make_cpu_backend(DType::kBF16);
        }
        MemoryTracker memory;
        const ParamLayout layout(spec);
        ZeroEngine engine(layout, *be, zo, &memory);
        Checkpointer ckpt(cfg, RankContext{}, engine, &memory);
        const std::optional<TrainingProgress> p = ckpt.load("t");
        ASSERT_TRUE(p.has_value());
        EXPECT_EQ(p->global_step, 3);
        EXPECT_EQ(engine.adam_steps(), 3);
        const std::vector<float> loaded = masters(engine);
        ASSERT_EQ(loaded.size(), saved.size());
        size_t differ = 0;
        for (size_t i = 0; i < saved.size(); ++i) differ += loaded[i] != saved[i];
        EXPECT_EQ(differ, 0u) << (strict ? "strict" : "cpu") << " of " << saved.size();
      }
    }
  }
}

// The whole trainer on the strict backend: training with validation, a checkpoint (sync and
// async) and a resume give the CPU backend's losses bit for bit, at stage 2 and at stage 3 with
// the optimizer states on the host; for GPT-2 and for Llama-family models (untied and tied output
// heads, Mistral's sliding window).
class DeviceMemoryTrainer : public ::testing::TestWithParam<testing::TinyModel> {};

TEST_P(DeviceMemoryTrainer, TrainsEvaluatesSavesAndResumesLikeTheCpu) {
  testing::TempCorpus corpus("zerod_device_trainer");
  struct Case {
    const char* name;
    int stage;
    std::string zero;
    bool async;
  };
  const Case cases[] = {{"stage 2, sync saves", 2, "", false},
                        {"stage 3, optimizer on cpu, async saves", 3,
                         R"(, "offload_optimizer": {"device": "cpu"})", true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto job = [&](const std::string& dir) {
      JobConfig cfg = testing::tiny_job(
          corpus, 1, c.stage, 2, 6, R"(, "bf16": {"enabled": true})",
          R"(, "checkpoint_dir": ")" + dir + R"(", "save_interval": 3)", 8, c.zero, GetParam());
      cfg.data.val_fraction = 0.1;  // (set here: the job text has no validation data)
      cfg.train.eval_interval = 3;
      cfg.train.eval_batches = 2;
      cfg.checkpoint.async = c.async;
      return cfg;
    };
    auto run = [&](const JobConfig& cfg, bool strict, const std::string& resume) {
      TrainerOptions o = testing::quiet_trainer();
      if (strict) o.backend = [] { return std::make_unique<StrictDeviceBackend>(DType::kBF16); };
      Trainer t(cfg, o);
      if (!resume.empty()) t.resume(resume);
      std::vector<double> losses;
      for (const StepMetrics& m : t.run().steps) {
        losses.push_back(m.loss);
        if (m.val_loss) losses.push_back(*m.val_loss);
      }
      return losses;
    };
    const std::string cpu_dir = (corpus.dir() / fmt::format("cpu_{}", c.stage)).string();
    const std::string dev_dir = (corpus.dir() / fmt::format("dev_{}", c.stage)).string();
    const std::vector<double> want = run(job(cpu_dir), false, "");
    const std::vector<double> got = run(job(dev_dir), true, "");
    ASSERT_EQ(got.size(), 8u) << "6 steps and 2 validations";
    EXPECT_EQ(got, want);
    EXPECT_LT(want[6], want[0]) << "the model learns";
    // Resume the device run from its step-3 checkpoint: the last 3 steps (and validation) again.
    const std::vector<double> rest = run(job(dev_dir), true, "global_step3");
    ASSERT_EQ(rest.size(), 4u);
    EXPECT_EQ(rest, std::vector<double>(want.end() - 4, want.end()));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceMemoryTrainer,
                         ::testing::Values(testing::tiny_gpt2(), testing::tiny_llama(),
                                           testing::tiny_llama_tied(), testing::tiny_mistral()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zerod::test
