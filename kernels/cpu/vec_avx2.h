// 8 fp32 lanes of AVX2 + FMA. Included by isa_avx2.cc inside its target region and namespace;
// includes nothing itself (<immintrin.h> comes first in that file).

struct Vec {
  using Reg = __m256;
  static constexpr int kWidth = 8;

  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float v) { return _mm256_set1_ps(v); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load(const Bf16* p) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
  }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static void store(Bf16* p, Reg v) {
    const __m256i high = _mm256_srli_epi32(roundedBits(v), 16);
    // packus works per 128-bit lane: [h0..h3 h0..h3 | h4..h7 h4..h7]; keep 64-bit words 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static Reg roundBf16(Reg v) {
    return _mm256_castsi256_ps(_mm256_and_si256(roundedBits(v), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }

  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }  // a * b + c
  static Reg sqrt(Reg a) { return _mm256_sqrt_ps(a); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg neg(Reg a) { return _mm256_xor_ps(a, set1(-0.0f)); }
  static Reg sign(Reg a) {
    const Reg pos = _mm256_and_ps(_mm256_cmp_ps(a, zero(), _CMP_GT_OQ), set1(1.0f));
    const Reg negative = _mm256_and_ps(_mm256_cmp_ps(a, zero(), _CMP_LT_OQ), set1(-1.0f));
    return _mm256_or_ps(pos, negative);
  }
  static float sum(Reg a) {
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
  }
  static float maxOf(Reg a) {
    __m128 v = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    v = _mm_max_ps(v, _mm_movehl_ps(v, v));
    v = _mm_max_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
  }

  // e^x as in vec_avx512.h, scaling by 2^n through the exponent bits: results below the normal
  // range are 0 (no denormals), above FLT_MAX inf.
  static Reg exp(Reg x) {
    const Reg tiny = _mm256_cmp_ps(x, set1(-87.33654f), _CMP_LT_OQ);
    const Reg huge = _mm256_cmp_ps(x, set1(88.72283f), _CMP_GT_OQ);
    x = _mm256_min_ps(set1(88.72283f), x);  // this operand order keeps a NaN
    x = _mm256_max_ps(set1(-87.33654f), x);
    const Reg n = _mm256_round_ps(mul(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    Reg p = set1(1.9875691500e-4f);
    p = fmadd(p, r, set1(1.3981999507e-3f));
    p = fmadd(p, r, set1(8.3334519073e-3f));
    p = fmadd(p, r, set1(4.1665795894e-2f));
    p = fmadd(p, r, set1(1.6666665459e-1f));
    p = fmadd(p, r, set1(5.0000001201e-1f));
    p = fmadd(p, mul(r, r), add(r, set1(1.0f)));
    // n in [-126, 128]: 2^n in two factors so that n = 128 (x just under 88.72) stays finite.
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const Reg s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    const Reg s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    Reg out = mul(mul(p, s1), s2);
    out = _mm256_andnot_ps(tiny, out);
    return _mm256_blendv_ps(out, set1(__builtin_inff()), huge);
  }

 private:
  static __m256i roundedBits(Reg v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc00000), nan);
  }
};
