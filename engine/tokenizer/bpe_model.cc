#include "engine/tokenizer/bpe_model.h"

#include <fmt/format.h>

#include <queue>

#include "core/error.h"
#include "engine/tokenizer/utf8.h"

namespace zerod::tokenizer {

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, std::string_view what)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    ZD_CHECK_INPUT(id >= 0, "{}: token {:?} has the negative id {}", what, token, id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_id_.assign(id_to_token_.size(), 0);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token;
    has_id_[id] = 1;
  }
  const size_t prefix_len = options_.continuing_subword_prefix.size();
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = vocab_.find(a), ib = vocab_.find(b);
    ZD_CHECK_INPUT(ia != vocab_.end(), "{}: merge {} ({:?} {:?}): {:?} is not in the vocabulary",
                   what, rank, a, b, a);
    ZD_CHECK_INPUT(ib != vocab_.end(), "{}: merge {} ({:?} {:?}): {:?} is not in the vocabulary",
                   what, rank, a, b, b);
    const std::string merged = a + b.substr(std::min(prefix_len, b.size()));
    const auto im = vocab_.find(merged);
    ZD_CHECK_INPUT(im != vocab_.end(),
                   "{}: merge {} ({:?} {:?}): the merged token {:?} is not in the vocabulary", what,
                   rank, a, b, merged);
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges_.insert_or_assign(key, MergeInfo{static_cast<int32_t>(rank), im->second});  // as tokenizers: the last wins
  }
  if (options_.unk_token) {
    const auto it = vocab_.find(*options_.unk_token);
    ZD_CHECK_INPUT(it != vocab_.end(), "{}: unk_token {:?} is not in the vocabulary", what,
                   *options_.unk_token);
    unk_id_ = it->second;
  }
  all_bytes_ = true;
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    all_bytes_ = all_bytes_ && it != vocab_.end();
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

const BpeModel::MergeInfo* BpeModel::find_merge(int32_t a, int32_t b) const {
  const auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWord;
  CacheShard& shard = cache_[std::hash<std::string_view>{}(word) % kCacheShards];
  if (cacheable) {
    std::lock_guard lock(shard.mu);
    if (const auto it = shard.words.find(word); it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard lock(shard.mu);
    if (shard.words.size() < kCacheShardCapacity) {
      shard.words.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
    }
  }
}

// tokenizers' BPE::merge_word followed by Word::merge_all.
void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t c;
    int32_t prev, next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, false});
  };
  int32_t pending_unk = -1;  // an unk not yet added (fuse_unk extends it)
  std::string piece;
  for (size_t i = 0; i < w.size();) {
    const size_t len = utf8_char_len(w, i);
    const bool is_first = i == 0, is_last = i + len == w.size();
    piece.clear();
    if (!is_first) piece += options_.continuing_subword_prefix;
    piece.append(w.substr(i, len));
    if (is_last) piece += options_.end_of_word_suffix;
    i += len;
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(it->second);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (char b : piece) all = all && byte_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        for (char b : piece) add(byte_ids_[static_cast<unsigned char>(b)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !options_.fuse_unk) add(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Merge {
    int32_t pos, rank, new_id;
    bool operator<(const Merge& o) const {  // the heap's top: lowest rank, then lowest pos
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Merge> storage;
  storage.reserve(symbols.size());
  std::priority_queue<Merge> queue(std::less<Merge>(), std::move(storage));
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeInfo* m = find_merge(symbols[i].c, symbols[i + 1].c)) {
      queue.push({static_cast<int32_t>(i), m->rank, m->new_id});
    }
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.removed || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    const MergeInfo* m = find_merge(cur.c, right.c);
    if (!m || m->new_id != top.new_id) continue;  // an expired entry
    cur.c = top.new_id;
    cur.next = right.next;
    symbols[next_pos].removed = true;
    if (right.next != -1) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeInfo* p = find_merge(symbols[cur.prev].c, cur.c)) {
        queue.push({cur.prev, p->rank, p->new_id});
      }
    }
    if (cur.next != -1) {
      if (const MergeInfo* n = find_merge(cur.c, symbols[cur.next].c)) {
        queue.push({top.pos, n->rank, n->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (!s.removed) out.push_back(s.c);
  }
}

}  // namespace zerod::tokenizer
