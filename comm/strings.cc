#include "comm/strings.h"

#include <cstring>

namespace zerod {

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  int64_t longest = static_cast<int64_t>(mine.size());
  comm.all_reduce(&longest, 1, CommType::kI64, ReduceOp::kMax);
  // Each rank's block: 8 bytes of length, then the bytes, padded to the longest.
  const int64_t block = 8 + longest;
  std::vector<uint8_t> send(static_cast<size_t>(block), 0);
  std::vector<uint8_t> recv(static_cast<size_t>(block * n), 0);
  const int64_t len = static_cast<int64_t>(mine.size());
  std::memcpy(send.data(), &len, 8);
  std::memcpy(send.data() + 8, mine.data(), mine.size());
  comm.all_gather(send.data(), recv.data(), block, CommType::kU8);
  std::vector<std::string> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    int64_t l = 0;
    std::memcpy(&l, recv.data() + r * block, 8);
    out[static_cast<size_t>(r)].assign(reinterpret_cast<const char*>(recv.data() + r * block + 8),
                                       static_cast<size_t>(l));
  }
  return out;
}

std::string broadcast_string(Communicator& comm, const std::string& value, int root) {
  int64_t len = comm.rank() == root ? static_cast<int64_t>(value.size()) : 0;
  comm.broadcast(&len, 1, CommType::kI64, root);
  std::string out = comm.rank() == root ? value : std::string(static_cast<size_t>(len), '\0');
  if (len > 0) comm.broadcast(out.data(), len, CommType::kU8, root);
  return out;
}

}  // namespace zerod
