// The built-in demo job: `zerod train` with no job file trains a small byte-level GPT on a
// corpus made of this project's own text files (README, docs and sources, embedded in the
// binary at build time), so a newcomer sees the loss fall within a minute on two cores.
#pragma once

#include <span>
#include <string>

#include "engine/config/parse.h"

namespace zerod {

// The embedded corpus (bytes of the concatenated project text files).
std::span<const uint8_t> demo_corpus();

// The demo job file's text: configs/demo.json with its "zerod-demo/" paths moved under `dir`.
std::string demo_job_text(const std::string& dir);

// Writes the corpus as byte-level shards under dir/data/ and returns the parsed demo job.
ParsedJob prepare_demo_job(const std::string& dir);

}  // namespace zerod
