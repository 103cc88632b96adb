// Bounds on what user input can make zerod do, shared by every reader of user files and requests:
//
// - JSON nesting depth. nlohmann::json's DOM, its destructor and dump() recurse once per level,
//   so 100,000 nested '[' overflow the stack (SIGSEGV). The text is scanned for its depth, without
//   recursion, before any tree is built, and refused past kMaxJsonDepth levels.
// - What a message quotes from user input: a prefix and the total length, never the whole value
//   (a 10 KB tag echoed into a gRPC status exceeds the client's metadata limit, and the client
//   then sees RESOURCE_EXHAUSTED instead of the INVALID_ARGUMENT that names the problem).
//
// - What a message quotes from a file the daemon reads for a job (data, weights, manifests):
//   nothing. The daemon may run as a user who can read what the client cannot (data.train:
//   /etc/shadow), and a job's errors go back to the client: they say what was expected and where,
//   never what was found (json_error_without_input drops nlohmann's "last read: '...'").
//
//   if (!config::json_depth_ok(text, file, problems)) return;  // "file: JSON nests ... levels"
//   ZD_THROW_INPUT("tag \"{}\" is invalid", config::clip_input(tag));
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace zerod::config {

struct Problems;

// Arrays and objects may nest this deep (a job file needs 4; Hugging Face config.json 3).
inline constexpr int kMaxJsonDepth = 64;
// A message quotes at most this many bytes of one user-supplied value.
inline constexpr size_t kMaxQuotedBytes = 128;
// train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps: the engine
// holds them in an int (a micro-batch of 2^40 would otherwise train as a cast's 0).
inline constexpr int64_t kMaxBatchSize = std::numeric_limits<int32_t>::max();

// "" when `text` nests arrays and objects at most `limit` levels deep; otherwise a message
// naming the depth, where it passes the limit and the limit:
//   "JSON nests 100000 levels deep (past the limit at line 1, column 65); at most 64 are allowed"
// Strings and // and /* */ comments are skipped; the scan is iterative and O(size). Text that
// is not valid JSON is left to the parser (the depth scanned up to the syntax error is what the
// parser would build).
std::string json_depth_problem(std::string_view text, int limit = kMaxJsonDepth);

// json_depth_problem as a problem of `path` (typically the file): false when one was recorded.
bool json_depth_ok(std::string_view text, std::string_view path, Problems& problems,
                   int limit = kMaxJsonDepth);

// Throws ConfigError (exit 2, INVALID_ARGUMENT) naming `source` when `text` nests too deep.
void check_json_depth(std::string_view text, const std::string& source, int limit = kMaxJsonDepth);

// User input as a message may quote it: all of it when it has at most `max` bytes, else its
// first `max` bytes (never half a UTF-8 character), "..." and the total length:
//   clip_input(std::string(10240, 'a')) == "aaa...aaa... (10240 bytes)"
std::string clip_input(std::string_view text, size_t max = kMaxQuotedBytes);

// An nlohmann::json exception's message without the input it quotes ("; last read: 'TOKEN'"),
// and without the "[json.exception.parse_error.101] " prefix:
//   "parse error at line 1, column 1: syntax error while parsing value - invalid literal"
std::string json_error_without_input(std::string_view what);

}  // namespace zerod::config
