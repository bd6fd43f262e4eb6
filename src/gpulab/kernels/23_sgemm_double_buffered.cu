// SGEMM step 8, double-buffered shared memory: load the next tile while computing on this one.
//
// In step 7 a block loads a tile, waits at a barrier, computes, waits again: while its loads travel
// from L2 or DRAM (hundreds of cycles) it can only wait, and only the SM's other resident block keeps
// the arithmetic units busy. Here shared memory holds two stages. At the top of each step the threads
// issue the global loads of the *next* tile into registers and, without waiting for them, compute
// on the current stage; then they store the registers into the other stage. The loads fly while
// the arithmetic runs, and one barrier per step is enough: a stage is overwritten only after every
// thread has passed the barrier that ended the last step reading it.
// Tiles as in step 7. Needs N and K to be multiples of 4; M is free.
// Launch with ceil(N/128) x ceil(M/128) blocks of 256 threads.
#define BM 128  // block tile
#define BN 128
#define BK 8
#define WM 64   // warp tile
#define WN 32
#define MIN_BLOCKS 2
#define LANES_M 8
#define LANES_N 4
#define WMITER (WM / (LANES_M * 4))
#define WNITER (WN / (LANES_N * 4))
#define THREADS (32 * (BM / WM) * (BN / WN))
#define LOADS_A (BM * BK / 4 / THREADS)
#define LOADS_B (BK * BN / 4 / THREADS)
#define PAD 4

static_assert(BM % WM == 0 && BN % WN == 0 && WM % (LANES_M * 4) == 0 && WN % (LANES_N * 4) == 0, "tiles");
static_assert(LOADS_A >= 1 && LOADS_B >= 1, "at least one float4 of each tile per thread");
static_assert(LOADS_A * THREADS * 4 == BM * BK && LOADS_B * THREADS * 4 == BK * BN, "whole float4s per thread");

__device__ __forceinline__ float4 load4(const float *p, bool inside)
{
    return inside ? *reinterpret_cast<const float4 *>(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
    sgemm_double_buffered(const float *__restrict__ A, const float *__restrict__ B, float *__restrict__ C,
                          int M, int N, int K)
{
    __shared__ __align__(16) float As[2][BK][BM + PAD];
    __shared__ __align__(16) float Bs[2][BK][BN];
    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int wr = warp / (BN / WN) * WM, wc = warp % (BN / WN) * WN;
    const int lr = lane / LANES_N * 4, lc = lane % LANES_N * 4;
    float acc[WMITER * 4][WNITER * 4] = {{0.0f}};
    float4 next_a[LOADS_A], next_b[LOADS_B];  // the next tile, in flight from global memory

    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < LOADS_A; ++i) {
            int f = t + i * THREADS, r = f / (BK / 4), kk = f % (BK / 4) * 4;
            next_a[i] = load4(A + (row0 + r) * K + k0 + kk, row0 + r < M && k0 + kk < K);
        }
#pragma unroll
        for (int i = 0; i < LOADS_B; ++i) {
            int f = t + i * THREADS, kk = f / (BN / 4), c = f % (BN / 4) * 4;
            next_b[i] = load4(B + (k0 + kk) * N + col0 + c, k0 + kk < K && col0 + c < N);
        }
    };
    auto store = [&](int stage) {
#pragma unroll
        for (int i = 0; i < LOADS_A; ++i) {
            int f = t + i * THREADS, r = f / (BK / 4), kk = f % (BK / 4) * 4;
            As[stage][kk + 0][r] = next_a[i].x;
            As[stage][kk + 1][r] = next_a[i].y;
            As[stage][kk + 2][r] = next_a[i].z;
            As[stage][kk + 3][r] = next_a[i].w;
        }
#pragma unroll
        for (int i = 0; i < LOADS_B; ++i) {
            int f = t + i * THREADS, kk = f / (BN / 4), c = f % (BN / 4) * 4;
            *reinterpret_cast<float4 *>(&Bs[stage][kk][c]) = next_b[i];
        }
    };

    load(0);
    store(0);
    __syncthreads();
    int stage = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) load(k0 + BK);  // issued now, used only after the arithmetic below
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[WMITER * 4], b[WNITER * 4];
#pragma unroll
            for (int im = 0; im < WMITER; ++im) {
                float4 v = *reinterpret_cast<const float4 *>(&As[stage][k][wr + im * LANES_M * 4 + lr]);
                a[im * 4 + 0] = v.x, a[im * 4 + 1] = v.y, a[im * 4 + 2] = v.z, a[im * 4 + 3] = v.w;
            }
#pragma unroll
            for (int jn = 0; jn < WNITER; ++jn) {
                float4 v = *reinterpret_cast<const float4 *>(&Bs[stage][k][wc + jn * LANES_N * 4 + lc]);
                b[jn * 4 + 0] = v.x, b[jn * 4 + 1] = v.y, b[jn * 4 + 2] = v.z, b[jn * 4 + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < WMITER * 4; ++i)
#pragma unroll
                for (int j = 0; j < WNITER * 4; ++j) acc[i][j] += a[i] * b[j];
        }
        if (more) store(stage ^ 1);
        __syncthreads();
        stage ^= 1;
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
