// One-row products for a decode step on a CPU: y (1, O) = x (1, I) @ W^T with W stored small, int8
// (a scale per row) or bfloat16, widened to float32 in registers and never stored wider, or float32.
//
// A decode step at batch 1 streams every weight once, and PyTorch's one-row kernels read an int8 row
// well below what plain reading reaches: the loads wait on memory. Here each row's bytes a few
// kilobytes ahead are asked for (prefetch) while four accumulators take the products, which brings
// them near the memory's speed (the measurements: docs/log.md, "The one-row operators"). Built by attnlab/quant/row_kernels.py with -march=native: the AVX-512 path, else AVX2,
// else plain loops. The rows are split among PyTorch's own threads (at::parallel_for).
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t AHEAD = 4096;  // bytes ahead: on GPT-2 small's head 1 KB read 11.6 GB/s, 2 KB 14.0, 4-8 KB 15-16
constexpr int64_t ROWS_PER_TASK = 64;

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

void check_row(const at::Tensor& x, const at::Tensor& w, c10::ScalarType kind) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "row products run on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(0) == 1, "x must be one float32 row (1, I)");
  TORCH_CHECK(w.scalar_type() == kind && w.dim() == 2 && w.size(1) == x.size(1), "the weight must be (O, I) ", kind);
}

// y[o] = row_dot(x, w[o]) * scales[o] (scales float32 or bfloat16, or none)
template <typename T, typename S>
at::Tensor row_product(const at::Tensor& x_in, const at::Tensor& w_in, const S* scales) {
  at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t rows = w.size(0), n = w.size(1);
  at::Tensor y = at::empty({1, rows}, x.options());
  const float* xp = x.data_ptr<float>();
  const T* wp = reinterpret_cast<const T*>(w.data_ptr());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const float dot = row_dot(xp, wp + o * n, n);
      yp[o] = scales ? dot * static_cast<float>(scales[o]) : dot;
    }
  });
  return y;
}

at::Tensor int8_row_product(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  check_row(x, codes, at::kChar);
  TORCH_CHECK(scales.numel() == codes.size(0), "scales must be (O,)");
  at::Tensor s = scales.contiguous();
  if (s.scalar_type() == at::kBFloat16)  // the int8 kernel's operand: the scales rounded to bfloat16
    return row_product<int8_t>(x, codes, s.data_ptr<c10::BFloat16>());
  TORCH_CHECK(s.scalar_type() == at::kFloat, "scales must be float32 or bfloat16");
  return row_product<int8_t>(x, codes, s.data_ptr<float>());
}

at::Tensor bf16_row_product(const at::Tensor& x, const at::Tensor& weight) {
  check_row(x, weight, at::kBFloat16);
  return row_product<c10::BFloat16, float>(x, weight, nullptr);
}

at::Tensor f32_row_product(const at::Tensor& x, const at::Tensor& weight) {
  check_row(x, weight, at::kFloat);
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
