#include "parallel/expert_exchange.h"

#include <vector>

#include "core/error.h"
#include "core/fault_points.h"
#include "model/op_timing.h"

namespace zerod {

namespace {
// The message tag of the dispatch / combine rows (a label checked on arrival).
constexpr int kExpertRowsTag = 23;
}  // namespace

ExpertParallelExchange::ExpertParallelExchange(Communicator& expert_group, Backend& backend)
    : comm_(expert_group),
      be_(backend),
      type_(backend.compute_elem_size() == 4         ? CommType::kF32
            : backend.compute_dtype() == DType::kF16 ? CommType::kF16
                                                     : CommType::kBF16) {}

void ExpertParallelExchange::exchange_counts(const int64_t* send, int64_t* recv, int64_t experts) {
  const int P = comm_.size();
  ZD_CHECK(experts % P == 0, "{} experts over an expert-parallel group of {} ranks", experts, P);
  comm_.all_to_all(send, recv, experts / P, CommType::kI64);
}

void ExpertParallelExchange::all_to_all_v(const void* send, const int64_t* send_rows, void* recv,
                                          const int64_t* recv_rows, int64_t width) {
  (void)fault_point("expert.all_to_all");  // tests: a rank killed inside the dispatch
  const int P = comm_.size(), me = comm_.rank();
  const size_t esz = be_.compute_elem_size();
  std::vector<P2POp> ops;
  int64_t so = 0, ro = 0;  // row offsets of the current blocks
  const void* self_src = nullptr;
  void* self_dst = nullptr;
  for (int p = 0; p < P; ++p) {
    const int64_t sn = send_rows[p], rn = recv_rows[p];
    ZD_CHECK(sn >= 0 && rn >= 0, "negative row counts {} / {} for expert rank {}", sn, rn, p);
    void* s = const_cast<char*>(elem_at(send, so * width, esz));
    void* r = elem_at(recv, ro * width, esz);
    if (p == me) {
      ZD_CHECK(sn == rn, "{} rows to this rank itself but {} expected", sn, rn);
      self_src = s;
      self_dst = r;
    } else {
      // Receives first: a Gloo send completes once its peer has posted the receive.
      if (rn > 0) ops.push_back(P2POp{P2POp::Kind::kRecv, r, rn * width, type_, p, kExpertRowsTag});
      if (sn > 0) {
        ops.push_back(P2POp{P2POp::Kind::kSend, s, sn * width, type_, p, kExpertRowsTag});
        sent_elems_ += sn * width;
      }
    }
    so += sn;
    ro += rn;
  }
  WorkPtr work = ops.empty() ? nullptr : comm_.p2p_async(ops);
  if (send_rows[me] > 0) {
    be_.copy(self_dst, self_src, static_cast<size_t>(send_rows[me] * width) * esz);
  }
  if (work) work->wait();
}

}  // namespace zerod
