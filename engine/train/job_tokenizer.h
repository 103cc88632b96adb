// The job's tokenizer (data.tokenizer): loaded and checked against the model when the job
// starts, copied into every checkpoint (CHECKPOINT/TAG/tokenizer/) so that `zerod generate
// --prompt`, `zerod eval` and `zeroctl export` find it there, and from there into Hugging Face
// exports, where AutoTokenizer.from_pretrained(DIR) loads it.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint/manifest.h"
#include "engine/config/job_config.h"
#include "engine/tokenizer/tokenizer.h"

namespace zerod {

struct JobTokenizer {
  std::string source;  // data.tokenizer
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;
  // The files to carry: the tokenizer's own (tokenizer.json, or vocab.json + merges.txt) and the
  // companions beside them (tokenizer_config.json, special_tokens_map.json).
  std::vector<std::filesystem::path> files;
  // tokenizer_config.json written for Hugging Face when the source has none ("" otherwise):
  // the tokenizer class, BOS/EOS tokens and model_max_length (the model's seq_len).
  std::string generated_config;
};

// data.tokenizer loaded; nullopt when the job has none. InputError naming data.tokenizer when it
// cannot be loaded, or when it has more ids than model.vocab_size (ids the model cannot embed).
std::optional<JobTokenizer> load_job_tokenizer(const JobConfig& cfg);

// Copies tok's files into `dir` (created; each file fsynced) by their names, plus the generated
// tokenizer_config.json. Returns them as a checkpoint's side files, named `prefix` + file name.
CheckpointTokenizer write_job_tokenizer(const JobTokenizer& tok, const std::filesystem::path& dir,
                                        const std::string& prefix);

// The tokenizer a checkpoint directory's checkpoint `which` ("latest" or a tag) carries, or
// nullptr when it has none (a job without data.tokenizer) or there is no such checkpoint (the
// weights' loader reports that). A tokenizer file that fails its CRC32C is an InputError.
std::unique_ptr<tokenizer::Tokenizer> load_checkpoint_tokenizer(const std::string& checkpoint_dir,
                                                                const std::string& which);

// The tokenizer of a weights source (`zerod generate/eval --from DIR`): a Hugging Face
// directory's own (tokenizer::load_tokenizer_in), or the one a checkpoint directory's
// checkpoint `which` carries; nullptr when it has none or `from` is not a directory.
std::unique_ptr<tokenizer::Tokenizer> load_source_tokenizer(const std::string& from,
                                                            const std::string& which);

}  // namespace zerod
