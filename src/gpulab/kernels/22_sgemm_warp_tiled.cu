// SGEMM step 7, warp tiling: the block's tile is cut into warp tiles, and each warp's lanes are laid
// out so that shared-memory reads never conflict.
//
// The hierarchy of CUTLASS: a block of 8 warps computes a 128 x 128 tile of C; each warp a 64 x 32
// warp tile; each thread 8 x 8 outputs. The 32 lanes of a warp form an 8 x 4 grid, and the warp tile
// is covered in 2 x 2 passes of 32 x 16, each lane taking a 4 x 4 piece of each pass. So the 8 lanes
// that share one shared-memory access cycle read at most 4 neighbouring float4s of B and 2 of A
// (the rest are broadcasts): no bank conflicts. A's tile is stored transposed and padded by 4 floats
// per row, so that the transposing stores do not conflict either.
// Needs N and K to be multiples of 4; M is free. Launch with ceil(N/128) x ceil(M/128) blocks of 256 threads.
#define BM 128           // block tile
#define BN 128
#define BK 8
#define WM 64            // warp tile
#define WN 32
#define LANES_M 8        // the lanes of a warp as an 8 x 4 grid, each with 4 x 4 outputs per pass
#define LANES_N 4
#define WMITER (WM / (LANES_M * 4))
#define WNITER (WN / (LANES_N * 4))
#define THREADS (32 * (BM / WM) * (BN / WN))
#define LOADS_A (BM * BK / 4 / THREADS)  // float4 loads per thread per tile
#define LOADS_B (BK * BN / 4 / THREADS)
#define PAD 4

static_assert(BM % WM == 0 && BN % WN == 0 && WM % (LANES_M * 4) == 0 && WN % (LANES_N * 4) == 0, "tiles");
static_assert(LOADS_A * THREADS * 4 == BM * BK && LOADS_B * THREADS * 4 == BK * BN, "whole float4s per thread");

__device__ __forceinline__ float4 load4(const float *p, bool inside)
{
    return inside ? *reinterpret_cast<const float4 *>(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

extern "C" __global__ void __launch_bounds__(THREADS) sgemm_warp_tiled(const float *A, const float *B, float *C,
                                                                       int M, int N, int K)
{
    __shared__ __align__(16) float As[BK][BM + PAD];  // transposed: As[k][m] = A[m][k]
    __shared__ __align__(16) float Bs[BK][BN];
    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int wr = warp / (BN / WN) * WM, wc = warp % (BN / WN) * WN;  // the warp's tile within the block's
    const int lr = lane / LANES_N * 4, lc = lane % LANES_N * 4;        // the lane's 4 x 4 within each pass
    float acc[WMITER * 4][WNITER * 4] = {{0.0f}};
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int i = 0; i < LOADS_A; ++i) {
            int f = t + i * THREADS, r = f / (BK / 4), kk = f % (BK / 4) * 4;
            float4 v = load4(A + (row0 + r) * K + k0 + kk, row0 + r < M && k0 + kk < K);
            As[kk + 0][r] = v.x;
            As[kk + 1][r] = v.y;
            As[kk + 2][r] = v.z;
            As[kk + 3][r] = v.w;
        }
#pragma unroll
        for (int i = 0; i < LOADS_B; ++i) {
            int f = t + i * THREADS, kk = f / (BN / 4), c = f % (BN / 4) * 4;
            *reinterpret_cast<float4 *>(&Bs[kk][c]) = load4(B + (k0 + kk) * N + col0 + c, k0 + kk < K && col0 + c < N);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[WMITER * 4], b[WNITER * 4];
#pragma unroll
            for (int im = 0; im < WMITER; ++im) {
                float4 v = *reinterpret_cast<const float4 *>(&As[k][wr + im * LANES_M * 4 + lr]);
                a[im * 4 + 0] = v.x, a[im * 4 + 1] = v.y, a[im * 4 + 2] = v.z, a[im * 4 + 3] = v.w;
            }
#pragma unroll
            for (int jn = 0; jn < WNITER; ++jn) {
                float4 v = *reinterpret_cast<const float4 *>(&Bs[k][wc + jn * LANES_N * 4 + lc]);
                b[jn * 4 + 0] = v.x, b[jn * 4 + 1] = v.y, b[jn * 4 + 2] = v.z, b[jn * 4 + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < WMITER * 4; ++i)
#pragma unroll
                for (int j = 0; j < WNITER * 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int im = 0; im < WMITER; ++im) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int row = row0 + wr + im * LANES_M * 4 + lr + i;
#pragma unroll
            for (int jn = 0; jn < WNITER; ++jn) {
                int col = col0 + wc + jn * LANES_N * 4 + lc;
                if (row < M && col < N) {
                    const int r = im * 4 + i, c = jn * 4;
                    *reinterpret_cast<float4 *>(&C[row * N + col]) =
                        make_float4(acc[r][c], acc[r][c + 1], acc[r][c + 2], acc[r][c + 3]);
                }
            }
        }
    }
}
