// Row products for a decode step on a CPU: y (M, O) = x (M, I) @ W^T with W stored small, int8 (a scale
// per row) or bfloat16, widened to float32 in registers and never stored wider, or float32. M is one row
// (batch 1) or a few (a batched step, 2-32 rows: a tile of two weight rows by up to TILE rows of x
// widens each weight vector once for its rows, so every weight byte comes from memory once for all).
//
// A decode step at batch 1 streams every weight once, and PyTorch's one-row kernels read an int8 row
// well below what plain reading reaches: the loads wait on memory. Here each row's bytes a few
// kilobytes ahead are asked for (prefetch) while four accumulators take the products, which brings
// them near the memory's speed (the measurements: docs/log.md, "The one-row operators"; batched rows:
// docs/cpu.md). Built by attnlab/quant/row_kernels.py with -march=native: the AVX-512 path, else AVX2,
// else plain loops. The weight rows are split among PyTorch's own threads (at::parallel_for).
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t AHEAD = 4096;  // bytes ahead: on GPT-2 small's head 1 KB read 11.6 GB/s, 2 KB 14.0, 4-8 KB 15-16
constexpr int64_t ROWS_PER_TASK = 64;
constexpr int64_t STRIP = 64;  // weight rows every tile of x meets in turn (64 of 3072 float32: 786 KB, in L2)
constexpr int TILE = 4;  // rows of x a tile takes: 2 weight rows x 4 = 8 accumulators, + 2 w + x in AVX2's 16 registers

inline float widen(int8_t v) { return static_cast<float>(v); }
inline float widen(c10::BFloat16 v) { return static_cast<float>(v); }
inline float widen(float v) { return v; }

template <typename T>
inline void ask_ahead(const T* w, int64_t elements) {
#if defined(__AVX512F__) || defined(__AVX2__)
  const char* p = reinterpret_cast<const char*>(w) + AHEAD;
  for (int64_t b = 0; b < elements * static_cast<int64_t>(sizeof(T)); b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
#endif
}

#if defined(__AVX512F__)
constexpr int64_t LANES = 16;
using Acc = __m512;
inline Acc zero() { return _mm512_setzero_ps(); }
inline Acc widened(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline Acc widened(const c10::BFloat16* p) {  // bf16 is float32's top half: widen to 32 bits, shift up
  __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
inline Acc widened(const float* p) { return _mm512_loadu_ps(p); }
inline Acc fma(Acc w, const float* x, Acc a) { return _mm512_fmadd_ps(w, _mm512_loadu_ps(x), a); }
inline Acc fma_acc(Acc w, Acc x, Acc a) { return _mm512_fmadd_ps(w, x, a); }
inline float total(Acc a) { return _mm512_reduce_add_ps(a); }
inline Acc add(Acc a, Acc b) { return _mm512_add_ps(a, b); }
#elif defined(__AVX2__)
constexpr int64_t LANES = 8;
using Acc = __m256;
inline Acc zero() { return _mm256_setzero_ps(); }
inline Acc widened(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline Acc widened(const c10::BFloat16* p) {
  __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
inline Acc widened(const float* p) { return _mm256_loadu_ps(p); }
inline Acc fma(Acc w, const float* x, Acc a) { return _mm256_fmadd_ps(w, _mm256_loadu_ps(x), a); }
inline Acc fma_acc(Acc w, Acc x, Acc a) { return _mm256_fmadd_ps(w, x, a); }
inline float total(Acc a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline Acc add(Acc a, Acc b) { return _mm256_add_ps(a, b); }
#endif

// sum_i x[i] * w[i] over one row of n weights
template <typename T>
float row_dot(const float* x, const T* w, int64_t n) {
  int64_t i = 0;
  float t = 0.f;
#if defined(__AVX512F__) || defined(__AVX2__)
  constexpr int64_t STEP = 4 * LANES;  // four accumulators: the fused multiply-adds do not wait on each other
  Acc a0 = zero(), a1 = zero(), a2 = zero(), a3 = zero();
  for (; i + STEP <= n; i += STEP) {
    ask_ahead(w + i, STEP);
    a0 = fma(widened(w + i), x + i, a0);
    a1 = fma(widened(w + i + LANES), x + i + LANES, a1);
    a2 = fma(widened(w + i + 2 * LANES), x + i + 2 * LANES, a2);
    a3 = fma(widened(w + i + 3 * LANES), x + i + 3 * LANES, a3);
  }
  t = total(add(add(a0, a1), add(a2, a3)));
#endif
  for (; i < n; ++i) t += x[i] * widen(w[i]);
  return t;
}

// out[k * R + r] = sum_i x[r][i] * w[k][i] for R rows of x (row r at x + r * n) and K rows of n weights
// (row k at w + k * n). Each weight vector is widened once for the R rows, and each x vector loaded once
// for the K weight rows: two weight rows halve the loads of x that a batch's products are bound by.
// With few products each keeps two accumulators (U), so that enough fused multiply-adds are in flight
// to hide their latency; from six the products alone are.
template <int K, int R, typename T>
void tile_dots(const float* x, int64_t n, const T* w, float* out) {
  int64_t i = 0;
  float t[K][R] = {};
#if defined(__AVX512F__) || defined(__AVX2__)
  constexpr int U = K * R <= 4 ? 2 : 1;
  constexpr int64_t STEP = U * LANES;
  Acc a[K][R][U];
  for (int k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < U; ++u) a[k][r][u] = zero();
  for (; i + STEP <= n; i += STEP) {
    for (int k = 0; k < K; ++k) ask_ahead(w + k * n + i, STEP);
    for (int u = 0; u < U; ++u) {
      Acc wide[K];
      for (int k = 0; k < K; ++k) wide[k] = widened(w + k * n + i + u * LANES);
      for (int r = 0; r < R; ++r) {
        const Acc xv = widened(x + r * n + i + u * LANES);
        for (int k = 0; k < K; ++k) a[k][r][u] = fma_acc(wide[k], xv, a[k][r][u]);
      }
    }
  }
  for (int k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r) t[k][r] = total(U == 2 ? add(a[k][r][0], a[k][r][U - 1]) : a[k][r][0]);
#endif
  for (; i < n; ++i)
    for (int k = 0; k < K; ++k) {
      const float wi = widen(w[k * n + i]);
      for (int r = 0; r < R; ++r) t[k][r] += x[r * n + i] * wi;
    }
  for (int k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r) out[k * R + r] = t[k][r];
}

// The tile for K (1, 2) weight rows and R (1..TILE) rows of x: a template per count, so that each one's
// accumulators stay in registers.
template <typename T>
void tile_of(int k, int rows, const float* x, int64_t n, const T* w, float* out) {
  using F = void (*)(const float*, int64_t, const T*, float*);
  static constexpr F one[TILE] = {tile_dots<1, 1, T>, tile_dots<1, 2, T>, tile_dots<1, 3, T>, tile_dots<1, 4, T>};
  static constexpr F two[TILE] = {tile_dots<2, 1, T>, tile_dots<2, 2, T>, tile_dots<2, 3, T>, tile_dots<2, 4, T>};
  (k == 2 ? two : one)[rows - 1](x, n, w, out);
}

void check_rows(const at::Tensor& x, const at::Tensor& w, c10::ScalarType kind) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "row products run on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(0) >= 1, "x must be float32 rows (M, I)");
  TORCH_CHECK(w.scalar_type() == kind && w.dim() == 2 && w.size(1) == x.size(1), "the weight must be (O, I) ", kind);
}

// y[r][o] = dot(x[r], w[o]) * scales[o] (scales float32 or bfloat16, or none). Tasks split the weight's
// rows; in a task each weight row is read from memory once and from the cache by the later tiles of x.
template <typename T, typename S>
at::Tensor row_product(const at::Tensor& x_in, const at::Tensor& w_in, const S* scales) {
  at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t m = x.size(0), rows = w.size(0), n = w.size(1);
  at::Tensor y = at::empty({m, rows}, x.options());
  const float* xp = x.data_ptr<float>();
  const T* wp = reinterpret_cast<const T*>(w.data_ptr());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    const auto scale = [&](int64_t o) { return scales ? static_cast<float>(scales[o]) : 1.f; };
    if (m == 1) {  // one row: four accumulators of its own (row_dot)
      for (int64_t o = begin; o < end; ++o) yp[o] = row_dot(xp, wp + o * n, n) * scale(o);
      return;
    }
    // A pass of every tile of x over STRIP weight rows: the strip stays in the cache (L2) while the tiles
    // read it, and each tile of x stays in L1 while it meets the strip's rows. (Each weight row meeting
    // every tile of x in turn instead re-read the whole of x from L2 for each weight row: 0.7x float32's
    // product at 32 rows of 768 x 3072.)
    float dots[2 * TILE];
    for (int64_t strip = begin; strip < end; strip += STRIP) {
      const int64_t last = std::min(end, strip + STRIP);
      for (int64_t r0 = 0; r0 < m; r0 += TILE) {
        const int count = static_cast<int>(std::min<int64_t>(TILE, m - r0));
        for (int64_t o = strip; o < last; o += 2) {
          const int k = o + 1 < last ? 2 : 1;  // weight rows in this tile
          tile_of(k, count, xp + r0 * n, n, wp + o * n, dots);
          for (int j = 0; j < k; ++j)
            for (int r = 0; r < count; ++r) yp[(r0 + r) * rows + o + j] = dots[j * count + r] * scale(o + j);
        }
      }
    }
  });
  return y;
}

at::Tensor int8_row_product(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  check_rows(x, codes, at::kChar);
  TORCH_CHECK(scales.numel() == codes.size(0), "scales must be (O,)");
  at::Tensor s = scales.contiguous();
  if (s.scalar_type() == at::kBFloat16)  // the int8 kernel's operand: the scales rounded to bfloat16
    return row_product<int8_t>(x, codes, s.data_ptr<c10::BFloat16>());
  TORCH_CHECK(s.scalar_type() == at::kFloat, "scales must be float32 or bfloat16");
  return row_product<int8_t>(x, codes, s.data_ptr<float>());
}

at::Tensor bf16_row_product(const at::Tensor& x, const at::Tensor& weight) {
  check_rows(x, weight, at::kBFloat16);
  return row_product<c10::BFloat16, float>(x, weight, nullptr);
}

at::Tensor f32_row_product(const at::Tensor& x, const at::Tensor& weight) {
  check_rows(x, weight, at::kFloat);
  return row_product<float, float>(x, weight, nullptr);
}

}  // namespace

TORCH_LIBRARY(attnlab, m) {
  m.def("int8_row_product(Tensor x, Tensor codes, Tensor scales) -> Tensor");
  m.def("bf16_row_product(Tensor x, Tensor weight) -> Tensor");
  m.def("f32_row_product(Tensor x, Tensor weight) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("int8_row_product", &int8_row_product);
  m.impl("bf16_row_product", &bf16_row_product);
  m.impl("f32_row_product", &f32_row_product);
}
