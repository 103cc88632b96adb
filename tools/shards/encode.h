// Tokenizing documents on all cores: each document is encoded by one thread, and the ids come
// out concatenated in document order, so the result does not depend on the number of threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace zerod::shards {

// Appends encode(doc) of every document to `out`, in order, each followed by `eos` when given
// (eos < 0: nothing). Uses up to `threads` threads (0: the hardware's count). With `starts`,
// appends there the index in `out` where each document's ids begin.
void encode_documents(const tokenizer::Tokenizer& tok, const std::vector<std::string>& docs,
                      int32_t eos, int threads, std::vector<uint32_t>& out,
                      std::vector<int64_t>* starts = nullptr);

}  // namespace zerod::shards
