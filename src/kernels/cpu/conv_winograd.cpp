// Winograd F(2x2, 3x3) convolution over channels-last activations (see conv_winograd.h).
//
// With the 4x4 input tile d, the 3x3 filter g and the 2x2 output block Y of one channel pair,
//   Y = A^T [(G g G^T) .* (B^T d B)] A
// where .* is the element-wise product of two 4x4 matrices. Summed over the input channels, each
// of the 16 positions xi of that product is one GEMM over all tiles:
//   M[xi] [tiles, Cout] = V[xi] [tiles, Cin] @ U[xi]^T,  U[xi] [Cout, Cin],
// V = B^T d B for every tile and U = G g G^T for every filter. The transforms only add, subtract
// and halve, so the result differs from im2col's by fp32 rounding alone.
#include "kernels/cpu/conv_winograd.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {

constexpr int64_t kPositions = 16;    // 4x4 transformed values per tile and channel
constexpr int64_t kGroupTiles = 1024; // output tiles per group of images (whole images)
// Transforming one filter and reading its 16 values back in the GEMMs costs about as much as
// this many multiply-adds of a GEMM (measured on AVX2, ResNet-18's last stage at batch 1).
constexpr int64_t kWeightTransformCost = 512;

// The 2x2 output tiles of one image: rows x cols of them, the last ones partial when Ho or Wo is
// odd.
struct TileGrid {
  int64_t rows, cols;
  explicit TileGrid(const ConvDims& d) : rows((d.ho + 1) / 2), cols((d.wo + 1) / 2) {}
  int64_t per_image() const { return rows * cols; }
};

// u [16, Cout, Cin] = G g G^T for every filter g = w[co, :, :, ci] (w [Cout, 3, 3, Cin]), with
// G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1].
void transform_weights(const float* w, const ConvDims& d, float* u) {
  const int64_t cin = d.cin, filters = d.cout * d.cin;
#pragma omp parallel for schedule(static)
  for (int64_t co = 0; co < d.cout; ++co) {
    const float* g = w + co * 9 * cin; // [3, 3, Cin]
    float* out = u + co * cin;
#pragma omp simd
    for (int64_t ci = 0; ci < cin; ++ci) {
      float t[4][3]; // G g
      for (int j = 0; j < 3; ++j) {
        const float g0 = g[j * cin + ci], g1 = g[(3 + j) * cin + ci], g2 = g[(6 + j) * cin + ci];
        t[0][j] = g0;
        t[1][j] = 0.5f * (g0 + g1 + g2);
        t[2][j] = 0.5f * (g0 - g1 + g2);
        t[3][j] = g2;
      }
      for (int r = 0; r < 4; ++r) { // (G g) G^T, row r
        float* row = out + r * 4 * filters + ci;
        row[0] = t[r][0];
        row[filters] = 0.5f * (t[r][0] + t[r][1] + t[r][2]);
        row[2 * filters] = 0.5f * (t[r][0] - t[r][1] + t[r][2]);
        row[3 * filters] = t[r][2];
      }
    }
  }
}

// v [16, tiles, Cin] = B^T d B for every tile of images [first, first + count), with
// B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]; padding reads as zero. x: [N, H, W, Cin].
void transform_input(const float* x, const ConvDims& d, int64_t first, int64_t count, float* v) {
  const TileGrid grid(d);
  const int64_t cin = d.cin, tiles = count * grid.per_image(), plane = tiles * cin;
  const std::vector<float> zeros(cin, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t image = first + t / grid.per_image(), tile = t % grid.per_image();
    const int64_t h0 = tile / grid.cols * 2 - d.pad, w0 = tile % grid.cols * 2 - d.pad;
    const float* p[4][4]; // the tile's pixels [Cin], or zeros where it overhangs the image
    for (int r = 0; r < 4; ++r)
      for (int s = 0; s < 4; ++s) {
        const int64_t ih = h0 + r, iw = w0 + s;
        const bool inside = ih >= 0 && ih < d.h && iw >= 0 && iw < d.w;
        p[r][s] = inside ? x + ((image * d.h + ih) * d.w + iw) * cin : zeros.data();
      }
    float* out = v + t * cin;
#pragma omp simd
    for (int64_t c = 0; c < cin; ++c) {
      float b[4][4]; // B^T d
      for (int s = 0; s < 4; ++s) {
        const float d0 = p[0][s][c], d1 = p[1][s][c], d2 = p[2][s][c], d3 = p[3][s][c];
        b[0][s] = d0 - d2;
        b[1][s] = d1 + d2;
        b[2][s] = d2 - d1;
        b[3][s] = d1 - d3;
      }
      for (int r = 0; r < 4; ++r) { // (B^T d) B, row r
        float* row = out + r * 4 * plane + c;
        row[0] = b[r][0] - b[r][2];
        row[plane] = b[r][1] + b[r][2];
        row[2 * plane] = b[r][2] - b[r][1];
        row[3 * plane] = b[r][1] - b[r][3];
      }
    }
  }
}

// y = A^T m A for every tile of images [first, first + count), A^T = [1 1 1 0; 0 1 -1 -1];
// m [16, tiles, Cout], y [N, Ho, Wo, Cout] (the parts of partial tiles outside it are dropped).
void transform_output(const float* m, const ConvDims& d, int64_t first, int64_t count, float* y) {
  const TileGrid grid(d);
  const int64_t cout = d.cout, tiles = count * grid.per_image(), plane = tiles * cout;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t image = first + t / grid.per_image(), tile = t % grid.per_image();
    const int64_t oh = tile / grid.cols * 2, ow = tile % grid.cols * 2;
    const bool whole = oh + 2 <= d.ho && ow + 2 <= d.wo;
    float* block = y + ((image * d.ho + oh) * d.wo + ow) * cout; // [2, 2, Cout] of y
    const float* in = m + t * cout;
    // A partial tile (odd Ho or Wo) is computed whole into `spill` and copied in part.
    std::vector<float> spill(whole ? 0 : 4 * cout);
    float* out = whole ? block : spill.data();
    const int64_t row_stride = whole ? d.wo * cout : 2 * cout;
#pragma omp simd
    for (int64_t c = 0; c < cout; ++c) {
      float a[2][4]; // A^T m
      for (int s = 0; s < 4; ++s) {
        const float m0 = in[s * plane + c], m1 = in[(4 + s) * plane + c],
                    m2 = in[(8 + s) * plane + c], m3 = in[(12 + s) * plane + c];
        a[0][s] = m0 + m1 + m2;
        a[1][s] = m1 - m2 - m3;
      }
      for (int r = 0; r < 2; ++r) { // (A^T m) A, row r
        out[r * row_stride + c] = a[r][0] + a[r][1] + a[r][2];
        out[r * row_stride + cout + c] = a[r][1] - a[r][2] - a[r][3];
      }
    }
    if (!whole)
      for (int64_t r = 0; r < std::min<int64_t>(2, d.ho - oh); ++r)
        std::copy_n(out + r * row_stride, std::min<int64_t>(2, d.wo - ow) * cout,
                    block + r * d.wo * cout);
  }
}

} // namespace

bool winograd_applies(const ConvDims& d) {
  if (d.kh != 3 || d.kw != 3 || d.stride != 1) return false;
  const int64_t tiles = d.n * TileGrid(d).per_image(), pixels = d.n * d.out_pixels();
  return kPositions * tiles + kWeightTransformCost < 9 * pixels;
}

void winograd_conv2d_forward(const float* x, const float* w, float* y, const ConvDims& d) {
  const TileGrid grid(d);
  const int64_t images = std::clamp<int64_t>(kGroupTiles / std::max<int64_t>(grid.per_image(), 1),
                                             1, std::max<int64_t>(d.n, 1));
  // Not zeroed first: every value is written before it is read.
  const std::unique_ptr<float[]> u(new float[kPositions * d.cout * d.cin]),
      v(new float[kPositions * images * grid.per_image() * d.cin]),
      m(new float[kPositions * images * grid.per_image() * d.cout]);
  transform_weights(w, d, u.get());
  for (int64_t first = 0; first < d.n; first += images) {
    const int64_t count = std::min(images, d.n - first), tiles = count * grid.per_image();
    transform_input(x, d, first, count, v.get());
    // One single-threaded Eigen product per position, spread over the threads.
#pragma omp parallel for schedule(static)
    for (int64_t xi = 0; xi < kPositions; ++xi) {
      const ConstMatrixMap v_xi(v.get() + xi * tiles * d.cin, tiles, d.cin);
      const ConstMatrixMap u_xi(u.get() + xi * d.cout * d.cin, d.cout, d.cin);
      MatrixMap(m.get() + xi * tiles * d.cout, tiles, d.cout).noalias() = v_xi * u_xi.transpose();
    }
    transform_output(m.get(), d, first, count, y);
  }
}

} // namespace minamp::cpu
