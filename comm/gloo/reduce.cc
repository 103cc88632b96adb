#include "comm/gloo/reduce.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace zerod::gloo_backend {

namespace {

template <typename T>
inline T max_of(T x, T y) {
  if constexpr (std::is_floating_point_v<T>) {
    return (x > y || x != x) ? x : y;  // NaN in x or y wins
  } else {
    return x > y ? x : y;
  }
}

template <typename T>
void reduce_typed(T* dst, const T* a, const T* b, size_t n, ReduceOp op) {
  if (op == ReduceOp::kSum) {
    if constexpr (std::is_same_v<T, uint8_t>) {
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(a[i] + b[i]);  // wraps mod 256
    } else {
      for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = max_of(a[i], b[i]);
  }
}

template <typename T>
void dispatch(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  reduce_typed(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n, op);
}

void reduce_plain(void* dst, const void* a, const void* b, size_t count, CommType type,
                  ReduceOp op) {
  switch (type) {
    case CommType::kF32:
      return dispatch<float>(dst, a, b, count, op);
    case CommType::kF64:
      return dispatch<double>(dst, a, b, count, op);
    case CommType::kI32:
      return dispatch<int32_t>(dst, a, b, count, op);
    case CommType::kI64:
      return dispatch<int64_t>(dst, a, b, count, op);
    case CommType::kU8:
      return dispatch<uint8_t>(dst, a, b, count, op);
    case CommType::kBF16:  // (refused when the collective is issued: check_reducible)
    case CommType::kF16:
      break;
  }
  ZD_THROW("cannot reduce CommType {}", comm_type_name(type));
}

// Copies with non-temporal stores (no read-for-ownership of dst, no cache pollution).
void stream_copy(uint8_t* dst, const uint8_t* src, size_t bytes) {
#if defined(__AVX512F__)
  constexpr size_t kVec = 64;
#elif defined(__AVX2__)
  constexpr size_t kVec = 32;
#else
  constexpr size_t kVec = 0;
#endif
  if constexpr (kVec == 0) {
    std::memcpy(dst, src, bytes);
  } else {
    const size_t head = std::min(bytes, (kVec - reinterpret_cast<uintptr_t>(dst) % kVec) % kVec);
    std::memcpy(dst, src, head);
    size_t i = head;
    for (; i + kVec <= bytes; i += kVec) {
#if defined(__AVX512F__)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i),
                          _mm512_loadu_si512(reinterpret_cast<const void*>(src + i)));
#elif defined(__AVX2__)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
#endif
    }
    std::memcpy(dst + i, src + i, bytes - i);
  }
}

bool overlaps(const void* x, const void* y, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(x);
  const auto b = reinterpret_cast<uintptr_t>(y);
  return a < b + bytes && b < a + bytes;
}

}  // namespace

void reduce_to(void* dst, const void* a, const void* b, size_t count, CommType type, ReduceOp op) {
  ZD_CHECK(op == ReduceOp::kSum || op == ReduceOp::kMax, "unknown ReduceOp {}",
           static_cast<int>(op));
  const size_t elem = comm_type_size(type);
  const size_t bytes = count * elem;
  // A large result that is neither input is written with streaming stores: reduce a block into
  // a buffer that stays in L1, then stream it out. Saves the read-for-ownership of dst, about a
  // third of the memory traffic of a reduce-scatter's last step.
  constexpr size_t kStreamMin = 256 << 10;
  constexpr size_t kBlock = 8 << 10;
  if (bytes < kStreamMin || overlaps(dst, a, bytes) || overlaps(dst, b, bytes)) {
    reduce_plain(dst, a, b, count, type, op);
    return;
  }
  alignas(64) static thread_local uint8_t block[kBlock];
  const size_t per = kBlock / elem;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < count; i += per) {
    const size_t n = std::min(per, count - i);
    reduce_plain(block, x + i * elem, y + i * elem, n, type, op);
    stream_copy(d + i * elem, block, n * elem);
  }
  _mm_sfence();  // streaming stores are weakly ordered: publish them before peers or readers look
}

void reduce_into(void* dst, const void* src, size_t count, CommType type, ReduceOp op) {
  reduce_to(dst, dst, src, count, type, op);
}

}  // namespace zerod::gloo_backend
