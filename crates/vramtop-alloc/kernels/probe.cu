// Probe kernels for vramtop's CUDA backing, compiled at run time by NVRTC.
//
// `pattern_word` must stay bit-for-bit equal to `pattern_word` in src/backing/mod.rs:
//   z = seed ^ index * 0x9E37_79B9_7F4A_7C15   (wrapping 64-bit multiply)
//   z = (z ^ (z >> 32)) * 0xD6E8_FEB8_6659_FD93 (wrapping)
//   word = high 32 bits of z
// Unsigned 64-bit arithmetic in CUDA C++ wraps modulo 2^64 exactly like Rust's
// wrapping_mul, and the shifts are logical on unsigned types, so the two agree.
//
// Both kernels take a byte length, not a word count, so they can honour the trait's
// rules for any range: word i covers bytes [4i, 4i+4) little-endian (as the host
// backing's to_le_bytes), and a short tail gets (or is compared with) the low bytes
// of the next word. Ranges from the allocator are 512-byte multiples at aligned
// addresses, so the byte-wise path only runs for hand-made ranges.

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 pattern_word(u64 seed, u64 index) {
    u64 z = seed ^ (index * 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 32)) * 0xD6E8FEB86659FD93ULL;
    return (u32)(z >> 32);
}

extern "C" __global__ void fill(unsigned char* p, u64 len, u64 seed) {
    const u64 words = (len + 3) / 4;
    const bool aligned = (((u64)p) & 3) == 0;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        const u32 w = pattern_word(seed, i);
        const u64 off = i * 4;
        if (aligned && off + 4 <= len) {
            *(u32*)(p + off) = w;
        } else {
            for (u32 b = 0; b < 4 && off + b < len; ++b) {
                p[off + b] = (unsigned char)(w >> (8 * b));
            }
        }
    }
}

extern "C" __global__ void verify(const unsigned char* p, u64 len, u64 seed, u64* mismatches) {
    const u64 words = (len + 3) / 4;
    const bool aligned = (((u64)p) & 3) == 0;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 bad = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        const u32 w = pattern_word(seed, i);
        const u64 off = i * 4;
        if (aligned && off + 4 <= len) {
            bad += (*(const u32*)(p + off) != w);
        } else {
            bool differs = false;
            for (u32 b = 0; b < 4 && off + b < len; ++b) {
                differs |= p[off + b] != (unsigned char)(w >> (8 * b));
            }
            bad += differs;
        }
    }
    // One atomic per thread that saw a mismatch: a clean verify does no atomics.
    if (bad != 0) {
        atomicAdd(mismatches, bad);
    }
}
