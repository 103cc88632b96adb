// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected; the checksum of iSCSI, ext4, gsutil and
// many checkpoint tools). The check value of "123456789" is 0xE3069283. Checkpoint manifests
// record it for every file.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zerod {

// The CRC32C of data[0, n) continuing from `crc`, the CRC32C of everything before it (0 for
// nothing), so crc32c(b, nb, crc32c(a, na)) == crc32c(a + b, na + nb). Uses the SSE4.2 crc32
// instruction (three interleaved streams) when the CPU has it, chosen at run time whatever the
// build flags; a slicing-by-8 table otherwise. Thread-safe.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// The two implementations behind crc32c(), for tests and benchmarks. crc32c_sse42() must only be
// called when crc32c_has_sse42() is true.
uint32_t crc32c_table(const void* data, size_t n, uint32_t crc = 0);
uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc = 0);
bool crc32c_has_sse42();

}  // namespace zerod
