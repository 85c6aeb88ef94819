// The index arithmetic of the CUDA convolution and max-pool kernels
// (src/backend/cuda/conv_index.h), run on the CPU: these tests run without a GPU.
//  - im2col_source: a convolution computed as the kernels compute it (columns, then a GEMM
//    written as loops) equals a direct convolution, for strides, padding, dilation and groups;
//  - col2im_sources: the gather the backward kernel runs equals the scatter-add of the columns
//    through im2col_source (the adjoint), exactly, on integer values;
//  - pool_windows_of: the windows visited for each input element are exactly those that
//    contain it.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "backend/cuda/conv_index.h"

using namespace athanor::cuda;

namespace {

struct Shape4 {
  int64_t N, C, H, W, OC, groups;
};

ConvGeom geom(const Shape4& s, int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
  ConvGeom g;
  g.N = s.N, g.C = s.C / s.groups, g.H = s.H, g.W = s.W, g.KH = KH, g.KW = KW;
  g.sh = sh, g.sw = sw, g.ph = ph, g.pw = pw, g.dh = dh, g.dw = dw;
  g.OH = (s.H + 2 * ph - dh * (KH - 1) - 1) / sh + 1;
  g.OW = (s.W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
  return g;
}

std::vector<double> ints(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<double>(static_cast<int>(g() % 9) - 4);
  return v;
}

}  // namespace

TEST(GpuConvIndex, Im2colThenGemmIsTheDirectConvolution) {
  struct Case {
    Shape4 s;
    int64_t KH, KW, sh, sw, ph, pw, dh, dw;
  };
  for (const Case& c : std::vector<Case>{{{2, 3, 7, 6, 4, 1}, 3, 3, 1, 1, 1, 1, 1, 1},
                                         {{1, 4, 9, 8, 6, 2}, 3, 2, 2, 1, 1, 0, 1, 2},
                                         {{2, 2, 5, 5, 2, 2}, 1, 1, 2, 2, 0, 0, 1, 1},
                                         {{1, 1, 28, 28, 3, 1}, 3, 3, 1, 1, 1, 1, 1, 1}}) {
    const ConvGeom g = geom(c.s, c.KH, c.KW, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw);
    ASSERT_GT(g.OH, 0);
    ASSERT_GT(g.OW, 0);
    const int64_t Cg = g.C, OCg = c.s.OC / c.s.groups, K = Cg * g.KH * g.KW, P = g.N * g.OH * g.OW;
    const std::vector<double> x = ints(static_cast<std::size_t>(c.s.N * c.s.C * c.s.H * c.s.W), 1);
    const std::vector<double> w = ints(static_cast<std::size_t>(c.s.OC * K), 2);
    for (int64_t gi = 0; gi < c.s.groups; ++gi) {
      // columns, then out[p, o] = Σ_k cols[p, k] w[gi OCg + o, k]
      std::vector<double> cols(static_cast<std::size_t>(P * K));
      for (int64_t p = 0; p < P; ++p)
        for (int64_t k = 0; k < K; ++k) {
          const int64_t src = im2col_source(g, c.s.C, gi * Cg, p, k);
          cols[static_cast<std::size_t>(p * K + k)] = src < 0 ? 0.0 : x[static_cast<std::size_t>(src)];
        }
      for (int64_t n = 0; n < g.N; ++n)
        for (int64_t o = 0; o < OCg; ++o)
          for (int64_t oh = 0; oh < g.OH; ++oh)
            for (int64_t ow = 0; ow < g.OW; ++ow) {
              const int64_t p = (n * g.OH + oh) * g.OW + ow;
              double got = 0, want = 0;
              for (int64_t k = 0; k < K; ++k)
                got += cols[static_cast<std::size_t>(p * K + k)] * w[static_cast<std::size_t>((gi * OCg + o) * K + k)];
              for (int64_t ci = 0; ci < Cg; ++ci)
                for (int64_t kh = 0; kh < g.KH; ++kh)
                  for (int64_t kw = 0; kw < g.KW; ++kw) {
                    const int64_t ih = oh * g.sh - g.ph + kh * g.dh, iw = ow * g.sw - g.pw + kw * g.dw;
                    if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                    want += x[static_cast<std::size_t>(((n * c.s.C + gi * Cg + ci) * g.H + ih) * g.W + iw)] *
                            w[static_cast<std::size_t>((gi * OCg + o) * K + (ci * g.KH + kh) * g.KW + kw)];
                  }
              ASSERT_EQ(got, want) << "group " << gi << " n " << n << " o " << o << " (" << oh << ", " << ow << ")";
            }
    }
  }
}

TEST(GpuConvIndex, Col2imGatherIsTheAdjointOfIm2col) {
  for (const auto& [s, KH, KW, sh, sw, ph, pw, dh, dw] :
       std::vector<std::tuple<Shape4, int, int, int, int, int, int, int, int>>{{{2, 3, 7, 6, 3, 1}, 3, 3, 1, 1, 1, 1, 1, 1},
                                                                               {{1, 4, 9, 8, 4, 2}, 3, 2, 2, 3, 2, 1, 2, 1},
                                                                               {{1, 2, 6, 6, 2, 1}, 2, 2, 2, 2, 0, 0, 1, 1}}) {
    const ConvGeom g = geom(s, KH, KW, sh, sw, ph, pw, dh, dw);
    const int64_t K = g.C * g.KH * g.KW, P = g.N * g.OH * g.OW;
    for (int64_t gi = 0; gi < s.groups; ++gi) {
      const std::vector<double> cols = ints(static_cast<std::size_t>(P * K), 5 + static_cast<unsigned>(gi));
      std::vector<double> scatter(static_cast<std::size_t>(s.N * s.C * s.H * s.W), 0.0);
      for (int64_t p = 0; p < P; ++p)
        for (int64_t k = 0; k < K; ++k) {
          const int64_t src = im2col_source(g, s.C, gi * g.C, p, k);
          if (src >= 0) scatter[static_cast<std::size_t>(src)] += cols[static_cast<std::size_t>(p * K + k)];
        }
      for (int64_t n = 0; n < g.N; ++n)
        for (int64_t ci = 0; ci < g.C; ++ci)
          for (int64_t ih = 0; ih < g.H; ++ih)
            for (int64_t iw = 0; iw < g.W; ++iw) {
              double gather = 0;
              col2im_sources(g, n, ci, ih, iw, [&](int64_t p, int64_t k) {
                ASSERT_EQ(im2col_source(g, s.C, gi * g.C, p, k), ((n * s.C + gi * g.C + ci) * g.H + ih) * g.W + iw);
                gather += cols[static_cast<std::size_t>(p * K + k)];
              });
              ASSERT_EQ(gather, scatter[static_cast<std::size_t>(((n * s.C + gi * g.C + ci) * g.H + ih) * g.W + iw)])
                  << "n " << n << " c " << ci << " (" << ih << ", " << iw << ")";
            }
    }
  }
}

TEST(GpuConvIndex, PoolWindowsOfAnElementAreExactlyThoseContainingIt) {
  for (const auto& [H, W, KH, KW, sh, sw, ph, pw] : std::vector<std::array<int64_t, 8>>{
           {28, 28, 2, 2, 2, 2, 0, 0}, {7, 9, 3, 3, 2, 2, 1, 1}, {5, 6, 3, 2, 1, 1, 1, 0}, {8, 8, 4, 4, 3, 2, 2, 2}}) {
    ConvGeom g;
    g.N = 1, g.C = 1, g.H = H, g.W = W, g.KH = KH, g.KW = KW, g.sh = sh, g.sw = sw, g.ph = ph, g.pw = pw;
    g.OH = (H + 2 * ph - KH) / sh + 1, g.OW = (W + 2 * pw - KW) / sw + 1;
    for (int64_t ih = 0; ih < H; ++ih)
      for (int64_t iw = 0; iw < W; ++iw) {
        std::vector<int64_t> got, want;
        pool_windows_of(g, ih, iw, [&](int64_t o) { got.push_back(o); });
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t ow = 0; ow < g.OW; ++ow)
            if (oh * sh - ph <= ih && ih < oh * sh - ph + KH && ow * sw - pw <= iw && iw < ow * sw - pw + KW)
              want.push_back(oh * g.OW + ow);
        ASSERT_EQ(got, want) << "(" << ih << ", " << iw << ") in " << H << "x" << W << " k " << KH << "x" << KW;
      }
  }
}
