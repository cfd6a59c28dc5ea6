#pragma once
#include <cstdint>
#include <cstring>
#include <cmath>
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.bits << 16; float f; memcpy(&f, &u, 4); return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {  // round to nearest even
    uint32_t u; memcpy(&u, &f, 4);
    if (std::isnan(f)) return {(uint16_t)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return {(uint16_t)(u >> 16)};
}
