// 4-bit weights times 8-bit activations, summed as integers: y (M, O) = x (M, I) @ W^T for a decode step.
//
// The weights: blocks of 32 of a row, BLOCK bytes each, laid out by attnlab/quant/packed.py's
// int4_blocks from the portable int4 codes: 16 bytes of codes (byte j holds weight j in its low nibble
// and weight j + 16 in its high one, so the two halves of a block come out of one load by a mask and a
// shift), then the block's scale s and zero z as bfloat16: w = (q - 8) * s + z = q * s + lo, lo = z - 8 s.
// The activations: each row's blocks of 32 rounded to int8 on entry, x ~ d * xq with d = absmax / 127
// (as GGUF's q8_0), and each block's float sum kept. Then a block's sum of products is
//     sum_j w_j x_j ~ s * d * sum_j q_j xq_j + lo * sum_j x_j
// with the sum of q_j xq_j taken by integer instructions, 32 products a few instructions: maddubs
// (u8 x s8 pairs to s16) and madd (to s32) on AVX2, vpdpbusd where the CPU has VNNI. Why: widening
// nibbles to float32 costs more instructions per weight than reading them saves (a float int4 row lost
// to PyTorch's int4 kernel, docs/log.md), and the integer products keep up with the memory.
// A tile of up to TILE rows takes each unpacked block: every weight byte is read once for all the rows.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t GROUP = 32;        // weights (and activations) per block
constexpr int64_t BLOCK = 20;        // bytes per block of weights: 16 of codes, a bf16 scale and zero
constexpr int64_t AHEAD = 4096;      // bytes ahead asked for, as in row_products.cpp
constexpr int64_t ROWS_PER_TASK = 64;
constexpr int64_t STRIP = 64;  // weight rows every tile of activations meets in turn
constexpr int TILE = 4;  // activation rows per unpacked block: 4 accumulators + the codes + temporaries

inline float bf16(const uint8_t* p) {
  c10::BFloat16 v;
  std::memcpy(&v, p, 2);
  return static_cast<float>(v);
}

// One row's activations as int8 blocks: xq (n), block g's d and sum at d[g * stride], sum[g * stride].
// Rounding is to nearest, ties to even, as torch.round (the tests rebuild it exactly).
void quantize_row(const float* x, int64_t n, int8_t* xq, float* d, float* sum, int64_t stride) {
  for (int64_t g = 0; g < n / GROUP; ++g) {
    const float* v = x + g * GROUP;
    float amax = 0.f, s = 0.f;
    for (int j = 0; j < GROUP; ++j) amax = std::max(amax, std::fabs(v[j])), s += v[j];
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int j = 0; j < GROUP; ++j) xq[g * GROUP + j] = static_cast<int8_t>(std::nearbyint(v[j] * inv));
    d[g * stride] = amax / 127.f;
    sum[g * stride] = s;
  }
}

#if defined(__AVX2__)
// 8 int32 partial sums of 32 products q_j * xq_j, q unsigned 0..15, xq signed
inline __m256i dot32(__m256i q, __m256i xq) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xq);
#else
  // |q * xq| pairs stay below 2 * 15 * 128: no saturation in 16 bits
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), _mm256_set1_epi16(1));
#endif
}

// Block b's 32 codes as bytes 0..15 (weight j at byte j), its scale s and lo = z - 8 s; the bytes AHEAD
// further on are asked for meanwhile.
inline __m256i unpacked(const uint8_t* b, float& s, float& lo) {
  _mm_prefetch(reinterpret_cast<const char*>(b) + AHEAD, _MM_HINT_T0);
  const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), low4 = _mm_set1_epi8(0x0F);
  s = bf16(b + 16);
  lo = bf16(b + 18) - 8.f * s;
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(codes, 4), low4), _mm_and_si128(codes, low4));
}

inline float total(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

// out[r] = sum over the row's blocks for R activation rows (row r's codes at xq + r * n, block g's d and
// sum at d[g * m + r], sum[g * m + r]) against one weight row of `blocks` blocks at w.
template <int R>
void tile_dots(const uint8_t* w, int64_t blocks, int64_t m, const int8_t* xq, const float* d, const float* sum,
               float* out) {
  const int64_t n = blocks * GROUP;
  float offset[R] = {};  // sum of lo * (the block's float sum): a scalar per block, beside the vectors
#if defined(__AVX2__)
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < blocks; ++g) {
    float s, lo;
    const __m256i q = unpacked(w + g * BLOCK, s, lo);
    for (int r = 0; r < R; ++r) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * n + g * GROUP));
      const __m256 p = _mm256_cvtepi32_ps(dot32(q, x));
      acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(s * d[g * m + r]), acc[r]);
      offset[r] += lo * sum[g * m + r];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = total(acc[r]) + offset[r];
#else
  float main[R] = {};
  for (int64_t g = 0; g < blocks; ++g) {
    const uint8_t* b = w + g * BLOCK;
    const float s = bf16(b + 16), lo = bf16(b + 18) - 8.f * s;
    for (int r = 0; r < R; ++r) {
      const int8_t* x = xq + r * n + g * GROUP;
      int32_t p = 0;
      for (int j = 0; j < 16; ++j) p += (b[j] & 0x0F) * x[j] + (b[j] >> 4) * x[j + 16];
      main[r] += static_cast<float>(p) * (s * d[g * m + r]);
      offset[r] += lo * sum[g * m + r];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = main[r] + offset[r];
#endif
}

#if defined(__AVX2__)
// Four rows at once: their 4 x 8 partial sums of a block folded by two horizontal adds into one vector,
// [row 0..3 | row 0..3] (the two halves of the block), so that the conversion to float, the scales and
// the fused multiply-add are one instruction for the four rows instead of one each.
void tile_dots4(const uint8_t* w, int64_t blocks, int64_t m, const int8_t* xq, const float* d, const float* sum,
                float* out) {
  const int64_t n = blocks * GROUP;
  __m256 acc = _mm256_setzero_ps();
  __m128 offset = _mm_setzero_ps();
  for (int64_t g = 0; g < blocks; ++g) {
    float s, lo;
    const __m256i q = unpacked(w + g * BLOCK, s, lo);
    __m256i p[4];
    for (int r = 0; r < 4; ++r)
      p[r] = dot32(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * n + g * GROUP)));
    const __m256i folded = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m128 scales = _mm_mul_ps(_mm_loadu_ps(d + g * m), _mm_set1_ps(s));  // s * d, rows 0..3
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(folded), _mm256_set_m128(scales, scales), acc);
    offset = _mm_fmadd_ps(_mm_loadu_ps(sum + g * m), _mm_set1_ps(lo), offset);
  }
  const __m128 dots = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  _mm_storeu_ps(out, _mm_add_ps(dots, offset));
}
#endif

void tile_of(int rows, const uint8_t* w, int64_t blocks, int64_t m, const int8_t* xq, const float* d,
             const float* sum, float* out) {
  switch (rows) {
    case 1: return tile_dots<1>(w, blocks, m, xq, d, sum, out);
    case 2: return tile_dots<2>(w, blocks, m, xq, d, sum, out);
    case 3: return tile_dots<3>(w, blocks, m, xq, d, sum, out);
#if defined(__AVX2__)
    default: return tile_dots4(w, blocks, m, xq, d, sum, out);
#else
    default: return tile_dots<TILE>(w, blocks, m, xq, d, sum, out);
#endif
  }
}

// x (M, I) float32, blocks (O, I / 32 * BLOCK) uint8 -> (M, O) float32
at::Tensor int4_row_product(const at::Tensor& x_in, const at::Tensor& w_in) {
  TORCH_CHECK(x_in.device().is_cpu() && w_in.device().is_cpu(), "row products run on the CPU");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.dim() == 2 && x_in.size(0) >= 1, "x must be float32 rows (M, I)");
  TORCH_CHECK(x_in.size(1) % GROUP == 0, "x's width must be a multiple of 32");
  const int64_t m = x_in.size(0), n = x_in.size(1), blocks = n / GROUP;
  TORCH_CHECK(w_in.scalar_type() == at::kByte && w_in.dim() == 2 && w_in.size(1) == blocks * BLOCK,
              "the weight must be int4 blocks (O, I / 32 * 20) uint8");
  at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t rows = w.size(0);
  at::Tensor xq = at::empty({m, n}, x.options().dtype(at::kChar));
  at::Tensor scales = at::empty({2, blocks, m}, x.options());  // d, then the blocks' sums: a block's rows side by side
  const float* xp = x.data_ptr<float>();
  int8_t* qp = xq.data_ptr<int8_t>();
  float *dp = scales.data_ptr<float>(), *sp = dp + m * blocks;
  for (int64_t r = 0; r < m; ++r) quantize_row(xp + r * n, n, qp + r * n, dp + r, sp + r, m);
  at::Tensor y = at::empty({m, rows}, x.options());
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    float dots[TILE];
    for (int64_t strip = begin; strip < end; strip += STRIP) {  // as row_products.cpp: the strip stays in L2
      const int64_t last = std::min(end, strip + STRIP);
      for (int64_t r0 = 0; r0 < m; r0 += TILE) {
        const int count = static_cast<int>(std::min<int64_t>(TILE, m - r0));
        for (int64_t o = strip; o < last; ++o) {
          tile_of(count, wp + o * blocks * BLOCK, blocks, m, qp + r0 * n, dp + r0, sp + r0, dots);
          for (int r = 0; r < count; ++r) yp[(r0 + r) * rows + o] = dots[r];
        }
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnlab, m) { m.def("int4_row_product(Tensor x, Tensor blocks) -> Tensor"); }

TORCH_LIBRARY_IMPL(attnlab, CPU, m) { m.impl("int4_row_product", &int4_row_product); }
