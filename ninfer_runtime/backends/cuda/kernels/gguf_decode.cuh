// Decoders of the 18 ggml block types kept verbatim in gguf_* objects, for the device and
// for the host (the CPU test compiles this file with g++ against the numpy decoder).
//
// gguf_group<TYPE>(block, g, v): values 32g .. 32g+31 of one block, exactly as the numpy
// decoder gives them (gguf-py's dequantizers): the same float32 operations in the same order,
// with GG_MUL/GG_ADD/GG_SUB so the device never contracts them into an FMA, and small
// integers made floats by GG_I2F (exact; on the device two full-rate operations, where a
// conversion instruction runs at a fraction of the rate and would bound the GEMV). Blocks are packed
// back to back at sizes like 18 or 110 bytes, so fields are read byte by byte. Needs the
// typedefs of common.cuh and the tables and macros of gguf_tables.source() first.

template <int TYPE>
struct GgufBlock;
#define GG_BLOCK(type, v, b)                   \
  template <>                                  \
  struct GgufBlock<type> {                     \
    static constexpr int values = v, bytes = b; \
  };
GG_BLOCK(2, 32, 18)     // q4_0
GG_BLOCK(6, 32, 22)     // q5_0
GG_BLOCK(8, 32, 34)     // q8_0
GG_BLOCK(10, 256, 84)   // q2_k
GG_BLOCK(11, 256, 110)  // q3_k
GG_BLOCK(12, 256, 144)  // q4_k
GG_BLOCK(13, 256, 176)  // q5_k
GG_BLOCK(14, 256, 210)  // q6_k
GG_BLOCK(16, 256, 66)   // iq2_xxs
GG_BLOCK(17, 256, 74)   // iq2_xs
GG_BLOCK(18, 256, 98)   // iq3_xxs
GG_BLOCK(19, 256, 50)   // iq1_s
GG_BLOCK(20, 32, 18)    // iq4_nl
GG_BLOCK(21, 256, 110)  // iq3_s
GG_BLOCK(22, 256, 82)   // iq2_s
GG_BLOCK(23, 256, 136)  // iq4_xs
GG_BLOCK(29, 256, 56)   // iq1_m
GG_BLOCK(42, 64, 18)    // q2_0
#undef GG_BLOCK

GG_HD u32 gg_u16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
GG_HD u32 gg_u32(const u8* p) { return gg_u16(p) | (gg_u16(p + 2) << 16); }

GG_HD float gg_bits(u32 bits) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
  return __uint_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}

// binary16 bits -> float32 (exact; subnormals as m * 2^-24; the device converts in one
// instruction, a NaN's payload aside)
GG_HD float gg_f16(u32 h) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
  return f;
#else
  const u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return gg_bits(sign | 0x7F800000u | (m << 13));
  if (e != 0) return gg_bits(sign | ((e + 112u) << 23) | (m << 13));
  const float f = (float)m * 5.9604644775390625e-08f;
  return sign ? -f : f;
#endif
}

// 32 bytes from a 16-byte aligned address (q4_k and q5_k blocks, 144 and 176 bytes, keep
// their code planes aligned in any object, whose start is 256-aligned), two wide loads
GG_HD void gg_copy32(const u8* p, u8 out[32]) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
  const uint4 a = reinterpret_cast<const uint4*>(p)[0], c = reinterpret_cast<const uint4*>(p)[1];
  const u32 w[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
  for (int i = 0; i < 32; ++i) out[i] = (u8)(w[i / 4] >> (8 * (i % 4)));
#else
  __builtin_memcpy(out, p, 32);
#endif
}

// the eight little-endian words of 32 bytes at a 16-byte aligned address
GG_HD void gg_words32(const u8* p, u32 w[8]) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
  const uint4 a = reinterpret_cast<const uint4*>(p)[0], c = reinterpret_cast<const uint4*>(p)[1];
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = c.x, w[5] = c.y, w[6] = c.z, w[7] = c.w;
#else
  for (int i = 0; i < 8; ++i) w[i] = gg_u32(p + 4 * i);
#endif
}

// the 6-bit scale and min of sub-block j (0..7) of a q4_k / q5_k block
GG_HD void gg_scale_min_k4(const u8* s, int j, float& sc, float& mn) {
  if (j < 4) {
    sc = GG_I2F(s[j] & 63);
    mn = GG_I2F(s[j + 4] & 63);
  } else {
    sc = GG_I2F((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    mn = GG_I2F((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// sub-block g's scale d * sc and min dmin * m of a q4_k / q5_k block
GG_HD void gg_k4_scale_min(const u8* b, int g, float& dl, float& ml) {
  float sc, mn;
  gg_scale_min_k4(b + 4, g, sc, mn);
  dl = GG_MUL(gg_f16(gg_u16(b)), sc);
  ml = GG_MUL(gg_f16(gg_u16(b + 2)), mn);
}

// the value of grid row bits `row`, byte i, as float (int8 bytes)
GG_HD float gg_grid(u64 row, int i) { return GG_I2F((signed char)(u8)(row >> (8 * i))); }

template <int TYPE>
GG_HD void gguf_group(const u8* b, int g, float v[32]) {
  if constexpr (TYPE == 2 || TYPE == 6 || TYPE == 20) {  // q4_0, q5_0, iq4_nl: 32 values
    const float d = gg_f16(gg_u16(b));
    const u8* qs = b + (TYPE == 6 ? 6 : 2);
    const u32 qh = TYPE == 6 ? gg_u32(b + 2) : 0;
    for (int j = 0; j < 32; ++j) {
      const int c = (qs[j & 15] >> (4 * (j >> 4))) & 0xF;
      if (TYPE == 20) {
        v[j] = GG_MUL(d, GG_I2F(GG_IQ4_VALUES[c]));
      } else if (TYPE == 2) {
        v[j] = GG_MUL(d, GG_I2F(c - 8));
      } else {
        v[j] = GG_MUL(d, GG_I2F((c | (int)((qh >> j) & 1) << 4) - 16));
      }
    }
  } else if constexpr (TYPE == 8) {  // q8_0
    const float d = gg_f16(gg_u16(b));
    for (int j = 0; j < 32; ++j) v[j] = GG_MUL(GG_I2F((signed char)b[2 + j]), d);
  } else if constexpr (TYPE == 42) {  // q2_0: 64 values
    const float d = gg_f16(gg_u16(b));
    for (int i = 0; i < 32; ++i) {
      const int j = 32 * g + i;
      v[i] = GG_MUL(GG_I2F(((b[2 + j / 4] >> (2 * (j % 4))) & 3) - 1), d);
    }
  } else if constexpr (TYPE == 10) {  // q2_k: group g is the 2-bit lane g % 4 of 32 bytes
    const float d = gg_f16(gg_u16(b + 80)), dmin = gg_f16(gg_u16(b + 82));
    const u8* qs = b + 16 + (g / 4) * 32;
    const int shift = 2 * (g % 4);
    for (int half = 0; half < 2; ++half) {
      const int s = b[2 * g + half];  // the 16 values' scale (low nibble) and min (high)
      const float dl = GG_MUL(d, GG_I2F(s & 0xF)), ml = GG_MUL(dmin, GG_I2F(s >> 4));
      for (int i = 16 * half; i < 16 * half + 16; ++i) {
        v[i] = GG_SUB(GG_MUL(dl, GG_I2F((qs[i] >> shift) & 3)), ml);
      }
    }
  } else if constexpr (TYPE == 11) {  // q3_k: low bits as q2_k, high bit g of hmask
    const float d = gg_f16(gg_u16(b + 108));
    const u8* sc = b + 96;
    const u8* qs = b + 32 + (g / 4) * 32;
    const int shift = 2 * (g % 4);
    for (int half = 0; half < 2; ++half) {
      const int k = 2 * g + half;  // the 16 values' 6-bit signed scale
      const int lo = (sc[k % 8] >> (4 * (k / 8))) & 0xF, hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
      const float dl = GG_MUL(d, GG_I2F((signed char)(lo | (hi << 4)) - 32));
      for (int i = 16 * half; i < 16 * half + 16; ++i) {
        const int q = ((qs[i] >> shift) & 3) - ((((b[i] >> g) & 1) ^ 1) << 2);
        v[i] = GG_MUL(dl, GG_I2F(q));
      }
    }
  } else if constexpr (TYPE == 12 || TYPE == 13) {  // q4_k, q5_k: sub-block g of 32
    float dl, ml;
    gg_k4_scale_min(b, g, dl, ml);
    u8 qs[32], qh[32];
    gg_copy32(b + (TYPE == 12 ? 16 : 48) + (g / 2) * 32, qs);
    if (TYPE == 13) gg_copy32(b + 16, qh);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[l] >> (4 * (g % 2))) & 0xF;
      if (TYPE == 13) q |= ((qh[l] >> g) & 1) << 4;
      v[l] = GG_SUB(GG_MUL(dl, GG_I2F(q)), ml);
    }
  } else if constexpr (TYPE == 14) {  // q6_k: low nibbles from ql, two high bits from qh
    const float d = gg_f16(gg_u16(b + 208));
    const u8* ql = b + (g / 4) * 64 + (g % 2) * 32;
    const u8* qh = b + 128 + (g / 4) * 32;
    const int low_shift = 4 * ((g % 4) / 2), high_shift = 2 * (g % 4);
    for (int half = 0; half < 2; ++half) {
      const float dl = GG_MUL(d, GG_I2F((signed char)b[192 + 2 * g + half]));
      for (int i = 16 * half; i < 16 * half + 16; ++i) {
        const int q = ((ql[i] >> low_shift) & 0xF) | (((qh[i] >> high_shift) & 3) << 4);
        v[i] = GG_MUL(dl, GG_I2F((signed char)q - 32));
      }
    }
  } else if constexpr (TYPE == 16 || TYPE == 18) {  // iq2_xxs, iq3_xxs: sub-block g
    const float d = gg_f16(gg_u16(b));
    const u32 aux = TYPE == 16 ? gg_u32(b + 2 + 8 * g + 4) : gg_u32(b + 66 + 4 * g);
    const float db = GG_MUL(GG_MUL(d, GG_ADD(0.5f, GG_I2F(aux >> 28))), TYPE == 16 ? 0.25f : 0.5f);
    for (int l = 0; l < 4; ++l) {
      const u32 signs = GG_KSIGNS[(aux >> (7 * l)) & 0x7F];
      for (int i = 0; i < 8; ++i) {
        float w;
        if (TYPE == 16) {
          w = gg_grid(GG_IQ2XXS_GRID[b[2 + 8 * g + l]], i);
        } else {
          w = gg_grid(GG_IQ3XXS_GRID[b[2 + 8 * g + 2 * l + i / 4]], i % 4);
        }
        const float x = GG_MUL(db, w);
        v[8 * l + i] = (signs >> i) & 1 ? -x : x;
      }
    }
  } else if constexpr (TYPE == 17 || TYPE == 22) {  // iq2_xs, iq2_s: four grid rows of 8
    const float d = gg_f16(gg_u16(b));
    const u8* scales = b + (TYPE == 17 ? 66 : 74);
    for (int u = 0; u < 4; ++u) {
      const int t = 4 * g + u;  // grid row within the block
      const float db =
          GG_MUL(GG_MUL(d, GG_ADD(0.5f, GG_I2F((scales[g] >> (4 * (u / 2))) & 0xF))), 0.25f);
      u32 index, signs;
      if (TYPE == 17) {
        const u32 q = gg_u16(b + 2 + 2 * t);
        index = q & 511;
        signs = GG_KSIGNS[q >> 9];
      } else {
        index = b[2 + t] | (((b[66 + t / 4] >> (2 * (t % 4))) & 3) << 8);
        signs = b[34 + t];
      }
      const u64 row = TYPE == 17 ? GG_IQ2XS_GRID[index] : GG_IQ2S_GRID[index];
      for (int i = 0; i < 8; ++i) {
        const float x = GG_MUL(db, gg_grid(row, i));
        v[8 * u + i] = (signs >> i) & 1 ? -x : x;
      }
    }
  } else if constexpr (TYPE == 21) {  // iq3_s
    const float d = gg_f16(gg_u16(b));
    const float db = GG_MUL(d, GG_I2F(1 + 2 * ((b[106 + g / 2] >> (4 * (g % 2))) & 0xF)));
    for (int u = 0; u < 8; ++u) {
      const int t = 8 * g + u;  // grid row of 4 within the block
      const u32 index = b[2 + t] | (((b[66 + t / 8] >> (t % 8)) & 1) << 8);
      for (int i = 0; i < 4; ++i) {
        const int j = 4 * t + i;
        const float x = GG_MUL(db, gg_grid(GG_IQ3S_GRID[index], i));
        v[4 * u + i] = (b[74 + j / 8] >> (j % 8)) & 1 ? -x : x;
      }
    }
  } else if constexpr (TYPE == 19 || TYPE == 29) {  // iq1_s, iq1_m: four grid rows of 8
    float d = 0.f;
    u32 qh1 = 0;
    if (TYPE == 19) {
      d = gg_f16(gg_u16(b));
      qh1 = gg_u16(b + 34 + 2 * g);
    } else {
      const u8* s = b + 48;
      d = gg_f16((gg_u16(s) >> 12) | ((gg_u16(s + 2) >> 8) & 0xF0) | ((gg_u16(s + 4) >> 4) & 0xF00) |
                 (gg_u16(s + 6) & 0xF000));
    }
    for (int u = 0; u < 4; ++u) {
      const int t = 4 * g + u;
      u32 index, scale, negative;
      if (TYPE == 19) {
        index = b[2 + t] | (((qh1 >> (3 * u)) & 7) << 8);
        scale = (qh1 >> 12) & 7;
        negative = qh1 & 0x8000;
      } else {
        const u32 qh = (b[32 + t / 2] >> (4 * (t % 2))) & 0xF;
        index = b[t] | ((qh & 7) << 8);
        scale = (gg_u16(b + 48 + 2 * (t / 8)) >> (3 * ((t / 2) % 4))) & 7;
        negative = qh & 8;
      }
      const float dl = GG_MUL(d, GG_I2F(2 * scale + 1));
      const float delta = negative ? -GG_IQ1_DELTA : GG_IQ1_DELTA;
      for (int i = 0; i < 8; ++i) {
        v[8 * u + i] = GG_MUL(dl, GG_ADD(gg_grid(GG_IQ1S_GRID[index], i), delta));
      }
    }
  } else if constexpr (TYPE == 23) {  // iq4_xs
    const float d = gg_f16(gg_u16(b));
    const int lo = (b[4 + g / 2] >> (4 * (g % 2))) & 0xF, hi = (gg_u16(b + 2) >> (2 * g)) & 3;
    const float dl = GG_MUL(d, GG_I2F((signed char)(lo | (hi << 4)) - 32));
    for (int i = 0; i < 32; ++i) {
      v[i] = GG_MUL(dl, GG_I2F(GG_IQ4_VALUES[(b[8 + 16 * g + i % 16] >> (4 * (i / 16))) & 0xF]));
    }
  }
}

// Whether gguf_dot<TYPE> has a factored form (else it decodes the group and multiplies).
template <int TYPE>
struct GgufFactored {
  static constexpr bool value = TYPE == 12 || TYPE == 13;
};

// What gguf_dot<TYPE> takes for a group's x (in place): for a factored type the odd entries
// scaled by 2^-8 (exact; gg_dot_codes4 reads the odd bytes' codes 8 bits up). -> sum x.
template <int TYPE>
GG_HD float gguf_dot_prepare(float x[32]) {
  float xsum = 0.f;
  for (int j = 0; j < 32; ++j) xsum = GG_ADD(xsum, x[j]);
  if (GgufFactored<TYPE>::value)
    for (int j = 1; j < 32; j += 2) x[j] = GG_MUL(x[j], 0.00390625f);
  return xsum;
}

// s0/s1 += x * code for the four codes of word c (code i in bits 8i .. under `mask`), x as
// gguf_dot_prepare leaves it: each code is OR-ed into the mantissa of 2^23, which subtracting
// 2^23 turns into the code (exact; the odd bytes' codes come out 2^8 times larger, and their
// x 2^8 times smaller): an AND-OR, a subtraction and an FMA a code.
GG_HD float gg_code_float(u32 c, u32 mask) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
  u32 bits;  // (c & mask) | 2^23's bits, one instruction (the compiler would make it two)
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(bits) : "r"(c), "r"(mask), "r"(0x4B000000u));
  return GG_SUB(gg_bits(bits), 8388608.0f);
#else
  return GG_SUB(gg_bits((c & mask) | 0x4B000000u), 8388608.0f);
#endif
}

GG_HD void gg_dot_codes4(u32 c, u32 mask, const float* x, float& s0, float& s1) {
  const u32 hi = c >> 16;
  s0 = GG_FMA(x[0], gg_code_float(c, mask), s0);
  s1 = GG_FMA(x[1], gg_code_float(c, mask << 8), s1);
  s0 = GG_FMA(x[2], gg_code_float(hi, mask), s0);
  s1 = GG_FMA(x[3], gg_code_float(hi, mask << 8), s1);
}

// sum_j x[j] * value j of group g (values 32g .. 32g+31 of a block), for x and xsum from
// gguf_dot_prepare<TYPE>. Factored types (q4_k, q5_k) take the codes' dot product with x and
// apply the group's scale and min once, dl * sum x q - ml * xsum: float32 rounding of the
// magnitudes dl * q and ml it sums. Others decode the values and multiply.
template <int TYPE>
GG_HD float gguf_dot(const u8* b, int g, const float x[32], float xsum) {
  if constexpr (TYPE == 12 || TYPE == 13) {
    float dl, ml;
    gg_k4_scale_min(b, g, dl, ml);
    u32 qs[8], qh[8];
    gg_words32(b + (TYPE == 12 ? 16 : 48) + (g / 2) * 32, qs);
    if (TYPE == 13) gg_words32(b + 16, qh);
    const int shift = 4 * (g % 2);
    float s[4] = {0.f, 0.f, 0.f, 0.f};  // four chains of FMAs in flight
    for (int w = 0; w < 8; ++w) {
      u32 c = (qs[w] >> shift) & 0x0F0F0F0Fu;
      if (TYPE == 13)  // bit g of each qh byte to bit 4 of the code's byte
        c |= (g <= 4 ? qh[w] << (4 - g) : qh[w] >> (g - 4)) & 0x10101010u;
      gg_dot_codes4(c, TYPE == 13 ? 0x1Fu : 0x0Fu, x + 4 * w, s[2 * (w % 2)], s[2 * (w % 2) + 1]);
    }
    return GG_SUB(GG_MUL(dl, GG_ADD(GG_ADD(s[0], s[1]), GG_ADD(s[2], s[3]))), GG_MUL(ml, xsum));
  } else {
    float v[32], s = 0.f;
    gguf_group<TYPE>(b, g, v);
    for (int j = 0; j < 32; ++j) s = GG_FMA(v[j], x[j], s);
    return s;
  }
}
