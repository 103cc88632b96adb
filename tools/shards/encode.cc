#include "tools/shards/encode.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

namespace zerod::shards {

void encode_documents(const tokenizer::Tokenizer& tok, const std::vector<std::string>& docs,
                      int32_t eos, int threads, std::vector<uint32_t>& out,
                      std::vector<int64_t>* starts) {
  const size_t n = docs.size();
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads =
      static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(n, 1)));
  std::vector<std::vector<int32_t>> ids(n);
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < n;) ids[i] = tok.encode(docs[i]);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  size_t total = 0;
  for (const auto& v : ids) total += v.size() + (eos >= 0 ? 1 : 0);
  out.reserve(out.size() + total);
  for (const auto& v : ids) {
    if (starts) starts->push_back(static_cast<int64_t>(out.size()));
    out.insert(out.end(), v.begin(), v.end());
    if (eos >= 0) out.push_back(static_cast<uint32_t>(eos));
  }
}

}  // namespace zerod::shards
