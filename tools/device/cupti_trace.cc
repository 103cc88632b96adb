// A CUDA injection library: the timeline of a whole process (every kernel, copy and memset on the
// GPU, every CUDA runtime and driver call on the host) from CUPTI's activity API, written at exit
// as one tab-separated line per record, for tools/device/trace_gaps.py. No Nsight Systems runs on
// the lent GPU machines (docs/gpu.md); this answers what it would: where the GPU sits idle in a
// training step and what the host was doing meanwhile.
//
//   CUDA_INJECTION64_PATH=libzerod_cupti_trace.so ZEROD_TRACE_FILE=trace.tsv zerod_gpu_bench ...
//
// The CUDA driver loads the library at cuInit and calls InitializeInjection(). Lines (times in
// nanoseconds on CUPTI's clock, the same for host and device records):
//   K <start> <end> <correlation> <stream> <kernel name>
//   M <start> <end> <correlation> <bytes> <copy kind>            (memcpy)
//   S <start> <end> <correlation> <bytes>                        (memset)
//   R <start> <end> <correlation> <thread> <runtime call name>
//   D <start> <end> <correlation> <thread> <driver call name>
// and a last line `# dropped <n>` (records CUPTI could not keep).
#include <cupti.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;

std::mutex g_mutex;
std::FILE* g_out = nullptr;
std::atomic<size_t> g_dropped{0};

void fail(const char* what, CUptiResult r) {
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "zerod_cupti_trace: %s: %s\n", what, msg != nullptr ? msg : "?");
}

const char* callback_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || name == nullptr) return "?";
  return name;
}

void write_record(const CUpti_Activity* rec) {
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      std::fprintf(g_out, "K\t%llu\t%llu\t%u\t%u\t%s\n", static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->correlationId, k->streamId,
                   k->name != nullptr ? k->name : "?");
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      std::fprintf(g_out, "M\t%llu\t%llu\t%u\t%llu\t%u\n",
                   static_cast<unsigned long long>(m->start),
                   static_cast<unsigned long long>(m->end), m->correlationId,
                   static_cast<unsigned long long>(m->bytes), static_cast<unsigned>(m->copyKind));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      std::fprintf(g_out, "S\t%llu\t%llu\t%u\t%llu\n", static_cast<unsigned long long>(m->start),
                   static_cast<unsigned long long>(m->end), m->correlationId,
                   static_cast<unsigned long long>(m->bytes));
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      const bool runtime = rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
      std::fprintf(g_out, "%c\t%llu\t%llu\t%u\t%u\t%s\n", runtime ? 'R' : 'D',
                   static_cast<unsigned long long>(a->start),
                   static_cast<unsigned long long>(a->end), a->correlationId, a->threadId,
                   callback_name(runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
                                 a->cbid));
      break;
    }
    default:
      break;
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t,
                               size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* rec = nullptr;
    while (g_out != nullptr && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
      write_record(rec);
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
    g_dropped += dropped;
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out == nullptr) return;
  std::fprintf(g_out, "# dropped %zu\n", g_dropped.load());
  std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  static bool done = false;
  if (done) return 1;
  done = true;
  const char* path = std::getenv("ZEROD_TRACE_FILE");
  g_out = std::fopen(path != nullptr && *path != '\0' ? path : "zerod_trace.tsv", "w");
  if (g_out == nullptr) {
    std::perror("zerod_cupti_trace: cannot open ZEROD_TRACE_FILE");
    return 0;
  }
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    fail("cuptiActivityRegisterCallbacks", r);
    return 0;
  }
  for (CUpti_ActivityKind kind :
       {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER}) {
    r = cuptiActivityEnable(kind);
    if (r != CUPTI_SUCCESS) fail("cuptiActivityEnable", r);
  }
  std::atexit(finish);
  std::fprintf(stderr, "zerod_cupti_trace: recording to %s\n",
               path != nullptr && *path != '\0' ? path : "zerod_trace.tsv");
  return 1;
}
