#pragma once
// IEEE binary16 via GCC's _Float16 (round-to-nearest-even conversions).
struct __half { _Float16 v; };
inline float __half2float(__half h) { return (float)h.v; }
inline __half __float2half(float f) { return {(_Float16)f}; }
