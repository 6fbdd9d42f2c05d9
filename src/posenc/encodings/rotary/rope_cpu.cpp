// One-pass rotary embedding on the CPU (Su et al. 2021, "RoFormer", eq. 34).
//
// Shapes: B batch, H heads, T length, D head_dim, R rotary dim (even, R <= D).
// x and out are [B, H, T, D] with any strides (out may be x: in place); cos and sin
// are contiguous [Bc, T, R/2] tables (Bc = 1 when shared by the batch) in the compute type: float for float32, bfloat16 and float16 inputs, double
// for float64. Every row of D features is read once and written once: each pair
// (a, b) becomes (a cos - b sin, a sin + b cos) computed in the compute type and rounded
// once to x's type; features R..D-1 are copied when out is not x. Rows are handed out
// to at::parallel_for's threads in small blocks from a shared counter, so a thread that
// the OS preempts delays the call by one block, not by half the work.
//
// Built by `python -m posenc.encodings.rotary.build_kernel`, called through ctypes;
// the entry point is `posenc_rope`, which returns 0, or 1 for an unknown dtype code.

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

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

// One row of D features. The unit-stride case (the usual one) is a loop the compiler
// vectorizes; other strides run the same arithmetic element by element, so a strided
// view gives bit for bit the result of its contiguous copy.
template <typename scalar_t, typename acc_t>
void rotate_row(const scalar_t* x, int64_t xs, scalar_t* out, int64_t os, const acc_t* cos,
                const acc_t* sin, int64_t half, bool interleaved, bool copy_rest,
                int64_t dim) {
  const int64_t second = interleaved ? 1 : half;  // offset of b from a
  const int64_t step = interleaved ? 2 : 1;       // offset between consecutive a's
  if (xs == 1 && os == 1 && !interleaved) {
    const scalar_t* x2 = x + half;
    scalar_t* out2 = out + half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const acc_t a = widen<scalar_t, acc_t>(x[i]), b = widen<scalar_t, acc_t>(x2[i]);
      out[i] = narrow<scalar_t, acc_t>(a * cos[i] - b * sin[i]);
      out2[i] = narrow<scalar_t, acc_t>(a * sin[i] + b * cos[i]);
    }
  } else if (xs == 1 && os == 1) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const acc_t a = widen<scalar_t, acc_t>(x[2 * i]), b = widen<scalar_t, acc_t>(x[2 * i + 1]);
      out[2 * i] = narrow<scalar_t, acc_t>(a * cos[i] - b * sin[i]);
      out[2 * i + 1] = narrow<scalar_t, acc_t>(a * sin[i] + b * cos[i]);
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const int64_t ia = i * step, ib = ia + second;
      const acc_t a = widen<scalar_t, acc_t>(x[ia * xs]), b = widen<scalar_t, acc_t>(x[ib * xs]);
      out[ia * os] = narrow<scalar_t, acc_t>(a * cos[i] - b * sin[i]);
      out[ib * os] = narrow<scalar_t, acc_t>(a * sin[i] + b * cos[i]);
    }
  }
  if (copy_rest) {
    for (int64_t j = 2 * half; j < dim; ++j) {
      out[j * os] = x[j * xs];
    }
  }
}

template <typename scalar_t, typename acc_t>
void rotate(const Layout& s, const void* x_ptr, void* out_ptr, const void* cos_ptr,
            const void* sin_ptr, bool interleaved) {
  const auto* x = static_cast<const scalar_t*>(x_ptr);
  auto* out = static_cast<scalar_t*>(out_ptr);
  const auto* cos = static_cast<const acc_t*>(cos_ptr);
  const auto* sin = static_cast<const acc_t*>(sin_ptr);
  const int64_t half = s.rotary / 2;
  const int64_t rows = s.batch * s.heads * s.length;
  const bool copy_rest = out != x && s.rotary < s.dim;
  const int64_t* xs = s.x_strides;
  const int64_t* os = s.out_strides;
  // about 32 KiB of x per block: small enough to balance, large enough to amortize
  const int64_t block = std::max<int64_t>(1, (32 << 10) / (s.dim * sizeof(scalar_t)));
  const int64_t blocks = (rows + block - 1) / block;
  std::atomic<int64_t> next{0};
  auto work = [&](int64_t, int64_t) {
    for (int64_t blk = next.fetch_add(1); blk < blocks; blk = next.fetch_add(1)) {
      const int64_t stop = std::min(rows, (blk + 1) * block);
      for (int64_t r = blk * block; r < stop; ++r) {
        const int64_t t = r % s.length, bh = r / s.length;
        const int64_t h = bh % s.heads, b = bh / s.heads;
        const int64_t table = ((s.table_batch == 1 ? 0 : b) * s.length + t) * half;
        rotate_row<scalar_t, acc_t>(x + b * xs[0] + h * xs[1] + t * xs[2], xs[3],
                                    out + b * os[0] + h * os[1] + t * os[2], os[3],
                                    cos + table, sin + table, half, interleaved, copy_rest,
                                    s.dim);
      }
    }
  };
  const int64_t workers = std::min<int64_t>(blocks, at::get_num_threads());
  if (workers <= 1) {
    work(0, 1);
  } else {
    at::parallel_for(0, workers, 1, work);
  }
}

}  // namespace

extern "C" int posenc_rope(int dtype, const void* x, void* out, const void* cos,
                           const void* sin, const int64_t* shape, const int64_t* x_strides,
                           const int64_t* out_strides, int64_t rotary, int64_t table_batch,
                           int interleaved) {
  const Layout s{shape[0], shape[1], shape[2], shape[3], rotary, x_strides, out_strides,
                 table_batch};
  switch (dtype) {
    case 0:
      rotate<float, float>(s, x, out, cos, sin, interleaved);
      return 0;
    case 1:
      rotate<double, double>(s, x, out, cos, sin, interleaved);
      return 0;
    case 2:
      rotate<Bf16Bits, float>(s, x, out, cos, sin, interleaved);
      return 0;
    case 3:
      rotate<c10::Half, float>(s, x, out, cos, sin, interleaved);
      return 0;
    default:
      return 1;
  }
}
