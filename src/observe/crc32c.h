#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord framing needs it.
#include <cstddef>
#include <cstdint>

namespace athanor::observe {

uint32_t crc32c(const void* data, size_t size);
// TFRecord stores CRCs masked so that a CRC of data that itself holds CRCs stays well mixed.
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace athanor::observe
