// zerod_tokenizer_probe: the C++ side of the tokenizer parity test (tests/tokenizer/parity.py).
//
//   zerod_tokenizer_probe info TOKENIZER                    JSON: kind, vocab size, BOS/EOS...
//   zerod_tokenizer_probe encode TOKENIZER TEXTS OUT [--specials]
//   zerod_tokenizer_probe decode TOKENIZER IDS OUT
//   zerod_tokenizer_probe roundtrip TOKENIZER TEXTS         decode(encode(x)) == x for each x
//   zerod_tokenizer_probe bench TOKENIZER TEXTS THREADS     encode throughput on THREADS threads
//
// TEXTS and decode's OUT: u32 count, then each text as u32 length + bytes. IDS and encode's
// OUT: u32 count, then each sequence as u32 length + int32 ids (little-endian).
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/tokenizer/tokenizer.h"

namespace zerod {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ZD_CHECK_INPUT(in.good(), "{}: cannot open", path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Reader {
  const std::string& s;
  size_t pos = 0;
  uint32_t u32() {
    ZD_CHECK_INPUT(pos + 4 <= s.size(), "truncated input at byte {}", pos);
    uint32_t v;
    std::memcpy(&v, s.data() + pos, 4);
    pos += 4;
    return v;
  }
  std::string_view bytes(size_t n) {
    ZD_CHECK_INPUT(pos + n <= s.size(), "truncated input at byte {}", pos);
    std::string_view v(s.data() + pos, n);
    pos += n;
    return v;
  }
};

std::vector<std::string_view> read_texts(const std::string& data) {
  Reader r{data};
  std::vector<std::string_view> texts(r.u32());
  for (auto& t : texts) t = r.bytes(r.u32());
  return texts;
}

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

void write_file(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  ZD_CHECK_INPUT(out.good(), "{}: cannot write", path);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(int argc, char** argv) {
  ZD_CHECK_INPUT(argc >= 3, "usage: zerod_tokenizer_probe info|encode|decode|roundtrip|bench TOKENIZER ...");
  const std::string cmd = argv[1];
  const auto tok = tokenizer::load_tokenizer(argv[2]);
  if (cmd == "info") {
    std::string specials;
    for (const auto& s : tok->special_tokens()) {
      specials += fmt::format("{}[{:?}, {}]", specials.empty() ? "" : ", ", s.content, s.id);
    }
    fmt::print("{{\"describe\": {:?}, \"vocab_size\": {}, \"bos\": {}, \"eos\": {}, "
               "\"add_bos\": {}, \"add_eos\": {}, \"specials\": [{}]}}\n",
               tok->describe(), tok->vocab_size(), tok->bos_id().value_or(-1),
               tok->eos_id().value_or(-1), tok->policy().add_bos, tok->policy().add_eos, specials);
    return 0;
  }
  if (cmd == "encode") {
    ZD_CHECK_INPUT(argc >= 5, "usage: zerod_tokenizer_probe encode TOKENIZER TEXTS OUT [--specials]");
    const bool specials = argc > 5 && std::string(argv[5]) == "--specials";
    const std::string data = read_all(argv[3]);
    const auto texts = read_texts(data);
    std::string out;
    put_u32(out, static_cast<uint32_t>(texts.size()));
    const auto t0 = std::chrono::steady_clock::now();
    size_t tokens = 0;
    for (std::string_view t : texts) {
      const auto ids = specials ? tok->encode_with_specials(t) : tok->encode(t);
      tokens += ids.size();
      put_u32(out, static_cast<uint32_t>(ids.size()));
      out.append(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
    }
    const double s = seconds_since(t0);
    write_file(argv[4], out);
    fmt::print(stderr, "{}: {} texts, {} bytes, {} tokens in {:.2f} s ({:.1f} MB/s)\n",
               tok->describe(), texts.size(), data.size(), tokens, s, data.size() / s / 1e6);
    return 0;
  }
  if (cmd == "decode") {
    ZD_CHECK_INPUT(argc >= 5, "usage: zerod_tokenizer_probe decode TOKENIZER IDS OUT");
    const std::string data = read_all(argv[3]);
    Reader r{data};
    const uint32_t n = r.u32();
    std::string out;
    put_u32(out, n);
    std::vector<int32_t> ids;
    for (uint32_t i = 0; i < n; ++i) {
      ids.resize(r.u32());
      std::memcpy(ids.data(), r.bytes(ids.size() * 4).data(), ids.size() * 4);
      const std::string text = tok->decode(ids);
      put_u32(out, static_cast<uint32_t>(text.size()));
      out += text;
    }
    write_file(argv[4], out);
    return 0;
  }
  if (cmd == "roundtrip") {
    ZD_CHECK_INPUT(argc >= 4, "usage: zerod_tokenizer_probe roundtrip TOKENIZER TEXTS");
    const std::string data = read_all(argv[3]);
    const auto texts = read_texts(data);
    size_t bad = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      if (tok->decode(tok->encode(texts[i])) != texts[i]) {
        if (bad++ < 5) fmt::print(stderr, "roundtrip: text {} differs\n", i);
      }
    }
    fmt::print("roundtrip: {} texts, {} bytes, {} differ\n", texts.size(), data.size(), bad);
    return bad == 0 ? 0 : 1;
  }
  if (cmd == "bench") {
    ZD_CHECK_INPUT(argc >= 5, "usage: zerod_tokenizer_probe bench TOKENIZER TEXTS THREADS");
    const std::string data = read_all(argv[3]);
    const auto texts = read_texts(data);
    const int threads = std::stoi(argv[4]);
    for (std::string_view t : texts) (void)tok->encode(t);  // warm the word cache, as HF's is
    std::atomic<size_t> next{0}, tokens{0};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k) {
      pool.emplace_back([&] {
        size_t mine = 0;
        for (size_t i; (i = next.fetch_add(1)) < texts.size();) mine += tok->encode(texts[i]).size();
        tokens += mine;
      });
    }
    for (auto& t : pool) t.join();
    const double s = seconds_since(t0);
    fmt::print("{{\"seconds\": {:.4f}, \"bytes\": {}, \"tokens\": {}, \"mb_s\": {:.2f}, "
               "\"tokens_s\": {:.0f}}}\n",
               s, data.size(), tokens.load(), data.size() / s / 1e6, tokens.load() / s);
    return 0;
  }
  ZD_THROW_INPUT("unknown command {:?} (info, encode, decode, roundtrip, bench)", cmd);
}

}  // namespace
}  // namespace zerod

int main(int argc, char** argv) {
  try {
    return zerod::run(argc, argv);
  } catch (...) {
    return zerod::report_current_exception("zerod_tokenizer_probe");
  }
}
