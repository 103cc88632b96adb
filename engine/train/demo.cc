#include "engine/train/demo.h"

#include "core/error.h"
#include "engine/data/corpus.h"

// The corpus and configs/demo.json are embedded at build time (engine/CMakeLists.txt).
#if !defined(ZEROD_DEMO_CORPUS_PATH) || !defined(ZEROD_DEMO_JOB_PATH)
#error "ZEROD_DEMO_CORPUS_PATH and ZEROD_DEMO_JOB_PATH must name the files to embed"
#endif
#define ZEROD_EMBED(name, path)            \
  asm(".section .rodata\n"                 \
      ".balign 64\n"                       \
      ".hidden " #name                     \
      "_begin\n"                           \
      ".hidden " #name "_end\n" #name      \
      "_begin:\n"                          \
      ".incbin \"" path "\"\n" #name       \
      "_end:\n"                            \
      ".previous\n");                      \
  extern "C" const uint8_t name##_begin[]; \
  extern "C" const uint8_t name##_end[];
ZEROD_EMBED(zerod_demo_corpus, ZEROD_DEMO_CORPUS_PATH)
ZEROD_EMBED(zerod_demo_job, ZEROD_DEMO_JOB_PATH)

namespace zerod {

std::span<const uint8_t> demo_corpus() {
  return {zerod_demo_corpus_begin,
          static_cast<size_t>(zerod_demo_corpus_end - zerod_demo_corpus_begin)};
}

std::string demo_job_text(const std::string& dir) {
  std::string text(reinterpret_cast<const char*>(zerod_demo_job_begin),
                   static_cast<size_t>(zerod_demo_job_end - zerod_demo_job_begin));
  const std::string from = "zerod-demo/", to = dir + "/";
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

ParsedJob prepare_demo_job(const std::string& dir) {
  const auto corpus = demo_corpus();
  ZD_CHECK(corpus.size() > 4096, "the embedded demo corpus is too small ({} bytes)", corpus.size());
  write_text_shards(corpus, dir + "/data", 0.05, int64_t{1} << 30, "demo");
  return parse_job_text(demo_job_text(dir), "<built-in demo job>");
}

}  // namespace zerod
