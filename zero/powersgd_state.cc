// PowerSGD's checkpoint state (zero/powersgd.h): this rank's residuals E and the warm-start Q as
// a little binary file, so a resume continues bit for bit.
#include "core/error.h"
#include "zero/onebit_bytes.h"
#include "zero/powersgd.h"

namespace zerod {

namespace {
constexpr char kMagic[8] = {'Z', 'D', 'P', 'S', 'G', 'D', '0', '1'};
using onebit_bytes::put;
}  // namespace

// magic, int32 world and rank, int64 iteration, q_ready, Q and E element counts, Q, E (fp32).
std::string PowerSgd::serialize() const {
  const PowerSgdState s = state();
  std::string out(kMagic, sizeof(kMagic));
  const int32_t head[2] = {comm_ != nullptr ? comm_->size() : 1,
                           comm_ != nullptr ? comm_->rank() : 0};
  const int64_t sizes[4] = {s.iteration, s.q_ready ? 1 : 0, static_cast<int64_t>(s.q.size()),
                            static_cast<int64_t>(s.error.size())};
  put(out, head, sizeof(head));
  put(out, sizes, sizeof(sizes));
  put(out, s.q.data(), s.q.size() * sizeof(float));
  put(out, s.error.data(), s.error.size() * sizeof(float));
  return out;
}

void PowerSgd::deserialize(const std::string& bytes, const std::string& what) {
  onebit_bytes::Reader in(bytes, what, kMagic);
  int32_t head[2];
  int64_t sizes[4];
  in.take(head, sizeof(head));
  in.take(sizes, sizeof(sizes));
  const int world = comm_ != nullptr ? comm_->size() : 1;
  if (head[0] != world)
    ZD_THROW_INPUT("{}: saved at world size {}, this run has {}", what, head[0], world);
  PowerSgdState s;
  s.iteration = sizes[0];
  s.q_ready = sizes[1] != 0;
  const PowerSgdState mine = state();
  if (sizes[2] != static_cast<int64_t>(mine.q.size()) ||
      sizes[3] != static_cast<int64_t>(mine.error.size()))
    ZD_THROW_INPUT(
        "{}: {} Q and {} residual elements, this model, rank and use_error_feedback "
        "need {} and {}",
        what, sizes[2], sizes[3], mine.q.size(), mine.error.size());
  s.q.resize(static_cast<size_t>(sizes[2]));
  s.error.resize(static_cast<size_t>(sizes[3]));
  in.take(s.q.data(), s.q.size() * sizeof(float));
  in.take(s.error.data(), s.error.size() * sizeof(float));
  set_state(s);
}

}  // namespace zerod
