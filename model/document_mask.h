// Document masking of packed sequences: a training sample is a window of tokens cut from a
// stream in which every document ends with an EOS token, so one sequence can hold the end of a
// document, whole documents and the start of another. With masking on, attention does not cross
// their boundaries and positions restart at 0 in each document (kernels/backend.h
// AttentionShape::doc_start).
#pragma once

#include <cstdint>

namespace zerod {

// doc_start (B,T) = for each position t of batch row b the first position of its document: a
// document starts at position 0 and right after each EOS token among the inputs, so
// doc_start[b,0] = 0 and doc_start[b,t] = t when inputs[b,t-1] == eos_token_id, else
// doc_start[b,t-1]. inputs (B,T) token ids (host memory).
void document_starts(const int32_t* inputs, int B, int T, int32_t eos_token_id, int32_t* doc_start);

}  // namespace zerod
