// One-pass rotary embedding on the CPU (Su et al. 2021, "RoFormer", eq. 34).
//
// Shapes: B batch, H heads, T length, D head_dim, R rotary dim (even, R <= D).
// x and out are [B, H, T, D] with any strides (out may be x: in place); cos and sin
// are contiguous [Bc, T, R/2] tables (Bc = 1 when shared by the batch) in the compute
// type: float for float32, bfloat16 and float16 inputs, double for float64. Every row
// of D features is read once and written once: each pair (a, b) becomes
// (a cos - b sin, a sin + b cos), each product and sum rounded in the compute type (no
// fused multiply-add, so every layout and the PyTorch path give the same bits; a NaN
// result is the canonical quiet NaN, as on the PyTorch path), then rounded once to x's
// type; features R..D-1 are copied when out is not x. Rows are
// walked in memory order with pointers that advance by the strides (no division per
// row), each of at::parallel_for's threads through one contiguous range of them.
//
// Registered as the operator posenc_cpu::rope_into (CPU only; the dispatcher refuses
// other devices). Built by torch.utils.cpp_extension on first use (see cpu_kernel.py);
// the Python caller resolves lazy negation and zero tensors, refuses other layouts and
// overlapping in-place rows, and copies tables that alias x. The checks below guard the
// memory accesses again, whoever calls the operator.

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

// Built for a CPU with AVX-512 (-march=native on Intel Skylake-SP and AMD Zen 4 on):
// float16 rows convert sixteen values per instruction, and bfloat16 rows too where the
// CPU also has AVX512-BF16 (Zen 4, Intel Cooper Lake and Sapphire Rapids on).
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#define POSENC_AVX512 1
#else
#define POSENC_AVX512 0
#endif
#if POSENC_AVX512 && defined(__AVX512BF16__)
#define POSENC_AVX512_BF16 1
#else
#define POSENC_AVX512_BF16 0
#endif

namespace {

// bfloat16 as its 16 bits, converted with integer arithmetic the compiler vectorizes:
// widening is a shift, narrowing rounds to nearest even (NaN stays a quiet NaN), the
// same results as c10::BFloat16.
struct Bf16Bits {
  uint16_t bits;
};

template <typename scalar_t, typename acc_t>
inline acc_t widen(scalar_t v) {
  return static_cast<acc_t>(v);
}

template <typename scalar_t, typename acc_t>
inline scalar_t narrow(acc_t v) {
  return static_cast<scalar_t>(v);
}

template <>
inline float widen<Bf16Bits, float>(Bf16Bits v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <>
inline Bf16Bits narrow<Bf16Bits, float>(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return Bf16Bits{static_cast<uint16_t>(v != v ? 0x7FC0u : rounded)};
}

struct Layout {
  int64_t batch, heads, length, dim, rotary;
  const int64_t* x_strides;    // 4 strides of x, in elements
  const int64_t* out_strides;  // 4 strides of out, in elements
  int64_t table_batch;         // 1: cos/sin shared by the batch, else B
};

// A NaN as the canonical quiet NaN of its type (positive, no payload). Which NaN operand a
// product or sum passes on, and whether narrowing keeps a payload, differ between
// instructions and between PyTorch's own loops; both paths write this one NaN instead.
template <typename acc_t>
inline acc_t canonical(acc_t v) {
  return v != v ? std::numeric_limits<acc_t>::quiet_NaN() : v;
}

// (a, b) -> (a cos - b sin, a sin + b cos) with every operation rounded on its own.
template <typename acc_t>
inline void turn(acc_t a, acc_t b, acc_t c, acc_t s, acc_t& new_a, acc_t& new_b) {
  const acc_t ac = a * c, bs = b * s, as = a * s, bc = b * c;
  new_a = canonical<acc_t>(ac - bs);
  new_b = canonical<acc_t>(as + bc);
}

// Where the pairs of a row lie: the two unit-stride layouts get loops the compiler
// vectorizes; any other strides run the same arithmetic element by element, so a strided
// view gives bit for bit the result of its contiguous copy.
enum class Pairs { kHalfSplit, kInterleaved, kStrided };

#if POSENC_AVX512
// Sixteen float16 widened to float, exactly.
inline __m512 widen16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Sixteen floats narrowed to float16 by VCVTPS2PH, rounding to nearest even: the
// instruction of c10::Half's own conversion on a CPU with F16C. It keeps a NaN's payload,
// so a NaN lane is made the canonical NaN first, as canonical<> does in the loops.
inline void narrow16(__m512 v, c10::Half* p) {
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  v = _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  const __m256i bits = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
}
#endif

#if POSENC_AVX512_BF16
// Sixteen bfloat16 widened to float: a shift of their bits, as widen<>.
inline __m512 widen16(const Bf16Bits* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Sixteen floats narrowed as narrow<> does. VCVTNEPS2BF16 rounds to nearest even too, but
// flushes subnormal floats to zero and keeps a NaN's sign and payload, so a vector with a
// NaN or subnormal lane (fpclass: quiet NaN 0x01, subnormal 0x20, signalling NaN 0x80)
// is narrowed lane by lane instead.
inline void narrow16(__m512 v, Bf16Bits* p) {
  if (_mm512_fpclass_ps_mask(v, 0x01 | 0x20 | 0x80) != 0) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    for (int j = 0; j < 16; ++j) {
      p[j] = narrow<Bf16Bits, float>(lanes[j]);
    }
    return;
  }
  const __m256i bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
}
#endif

#if POSENC_AVX512
// Half-split half-precision rows, sixteen pairs per step: the same products, sums and
// rounding as turn<float>, so the same bits.
template <typename scalar_t>
inline int64_t half_split16(const scalar_t* x, scalar_t* out, const float* cos, const float* sin,
                            int64_t half) {
  int64_t i = 0;
  for (; i + 16 <= half; i += 16) {
    const __m512 a = widen16(x + i), b = widen16(x + half + i);
    const __m512 c = _mm512_loadu_ps(cos + i), s = _mm512_loadu_ps(sin + i);
    narrow16(_mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)), out + i);
    narrow16(_mm512_add_ps(_mm512_mul_ps(a, s), _mm512_mul_ps(b, c)), out + half + i);
  }
  return i;
}

// Interleaved half-precision rows, sixteen pairs (two vectors of a, b lanes) per step:
// with each angle's cos and sin repeated for both lanes of its pair and the pairs' lanes
// swapped, even lanes take a c - b s and odd lanes b c + a s, which is a s + b c bit for
// bit.
template <typename scalar_t>
inline int64_t interleaved16(const scalar_t* x, scalar_t* out, const float* cos,
                             const float* sin, int64_t half) {
  const __m512i first = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const __mmask16 odd = 0xAAAA;
  int64_t i = 0;
  for (; i + 16 <= half; i += 16) {
    const __m512 c = _mm512_loadu_ps(cos + i), s = _mm512_loadu_ps(sin + i);
    for (int part = 0; part < 2; ++part) {
      const __m512i lanes = part == 0 ? first : second;
      const __m512 v = widen16(x + 2 * i + 16 * part);
      const __m512 swapped = _mm512_permute_ps(v, 0xB1);  // (a, b) -> (b, a) in each pair
      const __m512 vc = _mm512_mul_ps(v, _mm512_permutexvar_ps(lanes, c));
      const __m512 ws = _mm512_mul_ps(swapped, _mm512_permutexvar_ps(lanes, s));
      narrow16(_mm512_mask_add_ps(_mm512_sub_ps(vc, ws), odd, vc, ws), out + 2 * i + 16 * part);
    }
  }
  return i;
}
#endif

// The scalar types whose unit-stride rows the vector steps above convert.
template <typename scalar_t>
constexpr bool kSixteenLanes = false;
#if POSENC_AVX512
template <>
constexpr bool kSixteenLanes<c10::Half> = true;
#endif
#if POSENC_AVX512_BF16
template <>
constexpr bool kSixteenLanes<Bf16Bits> = true;
#endif

// The pairs [0, n) of a unit-stride row that a vector path rotates before the loops of
// rotate_row take the rest; returns n. None for float and double: the loops vectorize on
// their own.
template <typename scalar_t, typename acc_t, Pairs pairs>
inline int64_t rotate_prefix([[maybe_unused]] const scalar_t* x, [[maybe_unused]] scalar_t* out,
                             [[maybe_unused]] const acc_t* cos, [[maybe_unused]] const acc_t* sin,
                             [[maybe_unused]] int64_t half) {
#if POSENC_AVX512
  if constexpr (kSixteenLanes<scalar_t> && pairs == Pairs::kHalfSplit) {
    return half_split16(x, out, cos, sin, half);
  } else if constexpr (kSixteenLanes<scalar_t> && pairs == Pairs::kInterleaved) {
    return interleaved16(x, out, cos, sin, half);
  }
#endif
  return 0;
}

template <typename scalar_t, typename acc_t, Pairs pairs>
inline void rotate_row(const scalar_t* x, int64_t xs, scalar_t* out, int64_t os, const acc_t* cos,
                       const acc_t* sin, int64_t half, bool interleaved) {
  if constexpr (pairs == Pairs::kHalfSplit) {
    const scalar_t* x2 = x + half;
    scalar_t* out2 = out + half;
    const int64_t first = rotate_prefix<scalar_t, acc_t, pairs>(x, out, cos, sin, half);
#pragma omp simd
    for (int64_t i = first; i < half; ++i) {
      acc_t na, nb;
      turn<acc_t>(widen<scalar_t, acc_t>(x[i]), widen<scalar_t, acc_t>(x2[i]), cos[i], sin[i],
                  na, nb);
      out[i] = narrow<scalar_t, acc_t>(na);
      out2[i] = narrow<scalar_t, acc_t>(nb);
    }
  } else if constexpr (pairs == Pairs::kInterleaved) {
    const int64_t first = rotate_prefix<scalar_t, acc_t, pairs>(x, out, cos, sin, half);
#pragma omp simd
    for (int64_t i = first; i < half; ++i) {
      acc_t na, nb;
      turn<acc_t>(widen<scalar_t, acc_t>(x[2 * i]), widen<scalar_t, acc_t>(x[2 * i + 1]),
                  cos[i], sin[i], na, nb);
      out[2 * i] = narrow<scalar_t, acc_t>(na);
      out[2 * i + 1] = narrow<scalar_t, acc_t>(nb);
    }
  } else {
    const int64_t second = interleaved ? 1 : half;  // offset of b from a
    const int64_t step = interleaved ? 2 : 1;       // offset between consecutive a's
    for (int64_t i = 0; i < half; ++i) {
      const int64_t ia = i * step, ib = ia + second;
      acc_t na, nb;
      turn<acc_t>(widen<scalar_t, acc_t>(x[ia * xs]), widen<scalar_t, acc_t>(x[ib * xs]),
                  cos[i], sin[i], na, nb);
      out[ia * os] = narrow<scalar_t, acc_t>(na);
      out[ib * os] = narrow<scalar_t, acc_t>(nb);
    }
  }
}

// Ask for the cache lines of bytes [offset, offset + bytes) past p ahead of their use
// (a prefetch never faults, also past the end of the tensor).
inline void prefetch(const void* p, int64_t offset, int64_t bytes) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(p) + offset;
  for (int64_t j = 0; j < bytes; j += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(start + j));
  }
}

// Rows [first, stop) of the B*H*T rows, in memory order of (b, h, t): the row, output
// and table pointers advance by their strides, with no division per row. With unit
// feature strides, each row asks for the row and table rows about 8 KiB of x ahead: the
// hardware prefetcher alone does not keep three streams (x, cos, sin) in flight, and a
// bfloat16 row reads twice its bytes from the float tables.
template <typename scalar_t, typename acc_t, Pairs pairs>
void rotate_rows(const Layout& s, const scalar_t* x, scalar_t* out, const acc_t* cos,
                 const acc_t* sin, bool interleaved, int64_t first, int64_t stop) {
  const int64_t half = s.rotary / 2;
  const bool copy_rest = out != x && s.rotary < s.dim;
  const int64_t* xs = s.x_strides;
  const int64_t* os = s.out_strides;
  const int64_t row_bytes = s.dim * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t table_bytes = half * static_cast<int64_t>(sizeof(acc_t));
  const int64_t ahead = std::max<int64_t>(1, (8 << 10) / std::max<int64_t>(1, row_bytes));
  int64_t t = first % s.length, bh = first / s.length;
  for (int64_t r = first; r < stop; bh += 1, t = 0) {
    const int64_t h = bh % s.heads, b = bh / s.heads;
    const scalar_t* xr = x + b * xs[0] + h * xs[1] + t * xs[2];
    scalar_t* outr = out + b * os[0] + h * os[1] + t * os[2];
    const int64_t table = ((s.table_batch == 1 ? 0 : b) * s.length + t) * half;
    const acc_t* c = cos + table;
    const acc_t* sn = sin + table;
    const int64_t last = std::min(s.length, t + (stop - r));
    for (; t < last; ++t, ++r, xr += xs[2], outr += os[2], c += half, sn += half) {
      if constexpr (pairs != Pairs::kStrided) {
        prefetch(xr, ahead * xs[2] * static_cast<int64_t>(sizeof(scalar_t)), row_bytes);
        prefetch(c, ahead * table_bytes, table_bytes);
        prefetch(sn, ahead * table_bytes, table_bytes);
      }
      rotate_row<scalar_t, acc_t, pairs>(xr, xs[3], outr, os[3], c, sn, half, interleaved);
      if (copy_rest) {
        for (int64_t j = s.rotary; j < s.dim; ++j) {
          outr[j * os[3]] = xr[j * xs[3]];
        }
      }
    }
  }
}

template <typename scalar_t, typename acc_t, Pairs pairs>
void rotate_all(const Layout& s, const void* x_ptr, void* out_ptr, const void* cos_ptr,
                const void* sin_ptr, bool interleaved) {
  const auto* x = static_cast<const scalar_t*>(x_ptr);
  auto* out = static_cast<scalar_t*>(out_ptr);
  const auto* cos = static_cast<const acc_t*>(cos_ptr);
  const auto* sin = static_cast<const acc_t*>(sin_ptr);
  const int64_t rows = s.batch * s.heads * s.length;
  // at::parallel_for deals each thread one contiguous range of rows, walked in memory order
  // (ranges of at least about 1 MiB of x: a tensor under 2 MiB stays on one thread, where a
  // second thread would save tens of microseconds and, on a loaded machine, wait for a
  // core for milliseconds). Measured under load (two busy processes on the two cores),
  // this static split beat letting a thread that finished early take over the rest of
  // the other's range.
  const int64_t row_bytes = std::max<int64_t>(1, s.dim * static_cast<int64_t>(sizeof(scalar_t)));
  const int64_t grain = std::max<int64_t>(1, (1 << 20) / row_bytes);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    rotate_rows<scalar_t, acc_t, pairs>(s, x, out, cos, sin, interleaved, begin, end);
  });
}

template <typename scalar_t, typename acc_t>
void rotate(const Layout& s, const void* x_ptr, void* out_ptr, const void* cos_ptr,
            const void* sin_ptr, bool interleaved) {
  const bool unit = s.x_strides[3] == 1 && s.out_strides[3] == 1;
  if (unit && !interleaved) {
    rotate_all<scalar_t, acc_t, Pairs::kHalfSplit>(s, x_ptr, out_ptr, cos_ptr, sin_ptr, false);
  } else if (unit) {
    rotate_all<scalar_t, acc_t, Pairs::kInterleaved>(s, x_ptr, out_ptr, cos_ptr, sin_ptr, true);
  } else {
    rotate_all<scalar_t, acc_t, Pairs::kStrided>(s, x_ptr, out_ptr, cos_ptr, sin_ptr,
                                                 interleaved);
  }
}

void check_plain(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.layout() == c10::kStrided, name, " must be a strided tensor");
  TORCH_CHECK(!t.is_neg() && !t.is_conj(), name, " has a lazy negation/conjugation bit");
  TORCH_CHECK(!t._is_zerotensor(), name, " is an efficient zero tensor (no memory)");
  TORCH_CHECK(t.numel() == 0 || t.const_data_ptr() != nullptr, name, " has no data");
}

// out = rotate(x) (out may be x). cos/sin: contiguous [Bc, T, R/2] in the compute type.
void rope_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& cos,
               const at::Tensor& sin, bool interleaved) {
  check_plain(x, "x");
  check_plain(out, "out");
  check_plain(cos, "cos");
  check_plain(sin, "sin");
  TORCH_CHECK(x.dim() == 4 && out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type(),
              "x and out must be [B, H, T, D] of one shape and dtype");
  const bool wide = x.scalar_type() == at::kDouble;
  const auto compute = wide ? at::kDouble : at::kFloat;
  TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes() && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.scalar_type() == compute &&
                  sin.scalar_type() == compute,
              "cos/sin must be contiguous [Bc, T, R/2] tables of the compute dtype");
  const int64_t batch = x.size(0), length = x.size(2), dim = x.size(3), half = cos.size(2);
  TORCH_CHECK(cos.size(1) == length && (cos.size(0) == 1 || cos.size(0) == batch) &&
                  2 * half <= dim,
              "cos/sin do not fit x");
  const bool in_place = out.is_same(x);
  if (in_place) {
    TORCH_CHECK(at::has_internal_overlap(out) != at::MemOverlap::Yes,
                "x has elements that overlap in memory");
  } else {
    at::assert_no_internal_overlap(out);
    at::assert_no_overlap(out, x);
  }
  if (out.numel() > 0) {
    at::assert_no_overlap(out, cos);
    at::assert_no_overlap(out, sin);
  }
  if (x.numel() == 0) {
    return;
  }
  const Layout s{x.size(0), x.size(1),           length,          dim,
                 2 * half,  x.strides().data(), out.strides().data(), cos.size(0)};
  const void* xp = x.const_data_ptr();
  void* op = out.mutable_data_ptr();
  const void* cp = cos.const_data_ptr();
  const void* sp = sin.const_data_ptr();
  switch (x.scalar_type()) {
    case at::kFloat:
      rotate<float, float>(s, xp, op, cp, sp, interleaved);
      break;
    case at::kDouble:
      rotate<double, double>(s, xp, op, cp, sp, interleaved);
      break;
    case at::kBFloat16:
      rotate<Bf16Bits, float>(s, xp, op, cp, sp, interleaved);
      break;
    case at::kHalf:
      rotate<c10::Half, float>(s, xp, op, cp, sp, interleaved);
      break;
    default:
      TORCH_CHECK(false, "x must be float32, float64, bfloat16 or float16, got ",
                  x.scalar_type());
  }
}

}  // namespace

TORCH_LIBRARY(posenc_cpu, m) {
  m.def("rope_into(Tensor x, Tensor(a!) out, Tensor cos, Tensor sin, bool interleaved) -> ()");
}

TORCH_LIBRARY_IMPL(posenc_cpu, CPU, m) {
  m.impl("rope_into", &rope_into);
}
