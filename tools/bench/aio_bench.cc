// aio benchmark: zerod's aio engine against fio (libaio engine, direct=1) with the same block
// size, queue depth and thread count, writing then reading the same bytes on the same disk in
// the same run. Prints each setting and the ratio of the two best throughputs.
//
//   zerod_aio_bench [--dir DIR] [--size-mib 1024]   (small sizes are dominated by disk noise)
#include <fcntl.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/timer.h"
#include "offload/aio/aio_engine.h"

using namespace zerod;
namespace fs = std::filesystem;

namespace {

std::string capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// fio's throughput in MB/s (-1 when fio is missing or failed).
double fio_mbps(const std::string& file, bool write, int64_t bs, int depth, int jobs,
                int64_t size) {
  const int64_t per = size / jobs;
  const std::string cmd = fmt::format(
      "fio --name=z --filename={} --rw={} --bs={} --iodepth={} --numjobs={} --size={} "
      "--offset_increment={} --ioengine=libaio --direct=1 --group_reporting "
      "--output-format=json 2>/dev/null",
      file, write ? "write" : "read", bs, depth, jobs, per, per);
  const auto j = nlohmann::json::parse(capture(cmd), nullptr, false);
  if (j.is_discarded() || !j.contains("jobs")) return -1;
  const auto& job = j["jobs"][0][write ? "write" : "read"];
  return job["bw_bytes"].get<double>() / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  log::init();
  CLI::App app{"zerod aio benchmark (vs fio)"};
  std::string dir = "zerod-aio-bench", size_text = "1024";
  app.add_option("--dir", dir, "a directory on the disk to measure (removed afterwards)")
      ->capture_default_str();
  app.add_option("--size-mib", size_text, "MiB per run")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const int64_t size = std::stoll(size_text) << 20;
  fs::create_directories(dir);
  const std::string file = (fs::path(dir) / "aio.bin").string();
  AlignedBuffer buf(size);
  for (int64_t i = 0; i < size; ++i) buf.data()[i] = static_cast<char>(i * 131);

  fmt::print("aio benchmark: {} MiB per run on {}\n", size >> 20, dir);
  fmt::print("{:>8} {:>5} {:>7} | {:>10} {:>10} | {:>10} {:>10}\n", "block", "depth", "threads",
             "write ours", "write fio", "read ours", "read fio");
  double best[4] = {0, 0, 0, 0};
  for (const int64_t bs : {int64_t{128} << 10, int64_t{1} << 20, int64_t{8} << 20}) {
    for (const int depth : {1, 8, 32}) {
      for (const int threads : {1, 4}) {
        AioOptions o;
        o.block_size = bs;
        o.queue_depth = depth;
        o.threads = threads;
        AioEngine e(o);
        double ours_w, ours_r;
        {
          AioFile f(file, AioFile::Mode::kCreate);
          e.write(f, 0, buf, size);  // allocate the file's blocks first (fio writes over one too)
          ::fsync(f.fd());
          Stopwatch sw;
          e.write(f, 0, buf, size);
          ours_w = static_cast<double>(size) / sw.seconds() / 1e6;
          Stopwatch sr;
          e.read(f, 0, buf, size);
          ours_r = static_cast<double>(size) / sr.seconds() / 1e6;
        }
        const double fio_w = fio_mbps(file, true, bs, depth, threads, size);
        const double fio_r = fio_mbps(file, false, bs, depth, threads, size);
        fmt::print("{:>7}K {:>5} {:>7} | {:>10.0f} {:>10.0f} | {:>10.0f} {:>10.0f}\n", bs >> 10,
                   depth, threads, ours_w, fio_w, ours_r, fio_r);
        best[0] = std::max(best[0], ours_w);
        best[1] = std::max(best[1], fio_w);
        best[2] = std::max(best[2], ours_r);
        best[3] = std::max(best[3], fio_r);
      }
    }
  }
  fs::remove_all(dir);
  fmt::print(
      "best: write {:.0f} vs fio {:.0f} MB/s (ratio {:.2f}); read {:.0f} vs fio {:.0f} MB/s "
      "(ratio {:.2f})\n",
      best[0], best[1], best[0] / best[1], best[2], best[3], best[2] / best[3]);
  return 0;
}
