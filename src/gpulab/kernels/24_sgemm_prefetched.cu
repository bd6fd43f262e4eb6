// SGEMM step 9, prefetched fragments: double buffering one level down, in registers.
//
// Step 8 hides the wait for global memory, but inside a tile each slice k still loads its fragments
// from shared memory and then uses them at once: about 30 cycles of latency per slice that only other
// warps can cover. Here registers hold two sets of fragments: while the multiply-adds of slice k run,
// the loads of slice k + 1's fragments are already in flight. At the last slice of a tile the
// prefetched global tile is stored to the other stage, one barrier passes, and the first slice of
// the new tile is fetched before the last multiply-adds of the old one.
//
// The tile sizes are macros, so that a sweep can compile variants with -D (the defaults are the
// sweep's best on an H200): block tile BM x BN, depth BK, warp tile WM x WN, and MIN_BLOCKS, the
// resident blocks per SM that __launch_bounds__ asks the compiler to fit (it caps the registers).
// Needs N and K to be multiples of 4; M is free. Launch with ceil(N/BN) x ceil(M/BM) blocks of THREADS.
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 8
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 32
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 2
#endif
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
static_assert(BK % 2 == 0, "the fragment sets alternate, and the next tile's first slice goes to set 0");
static_assert(LOADS_A * THREADS * 4 == BM * BK && LOADS_B * THREADS * 4 == BK * BN, "whole float4s per thread");

__device__ __forceinline__ float4 load4(const float *p, bool inside)
{
    return inside ? *reinterpret_cast<const float4 *>(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
    sgemm_prefetched(const float *__restrict__ A, const float *__restrict__ B, float *__restrict__ C,
                     int M, int N, int K)
{
    __shared__ __align__(16) float As[2][BK][BM + PAD];
    __shared__ __align__(16) float Bs[2][BK][BN];
    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int wr = warp / (BN / WN) * WM, wc = warp % (BN / WN) * WN;
    const int lr = lane / LANES_N * 4, lc = lane % LANES_N * 4;
    float acc[WMITER * 4][WNITER * 4] = {{0.0f}};
    float4 next_a[LOADS_A], next_b[LOADS_B];    // the next tile, in flight from global memory
    float a[2][WMITER * 4], b[2][WNITER * 4];  // two slices' fragments: one in use, one arriving

    auto load_tile = [&](int k0) {
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
    auto store_tile = [&](int stage) {
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
    auto load_fragments = [&](int set, int stage, int k) {
#pragma unroll
        for (int im = 0; im < WMITER; ++im) {
            float4 v = *reinterpret_cast<const float4 *>(&As[stage][k][wr + im * LANES_M * 4 + lr]);
            a[set][im * 4 + 0] = v.x, a[set][im * 4 + 1] = v.y, a[set][im * 4 + 2] = v.z, a[set][im * 4 + 3] = v.w;
        }
#pragma unroll
        for (int jn = 0; jn < WNITER; ++jn) {
            float4 v = *reinterpret_cast<const float4 *>(&Bs[stage][k][wc + jn * LANES_N * 4 + lc]);
            b[set][jn * 4 + 0] = v.x, b[set][jn * 4 + 1] = v.y, b[set][jn * 4 + 2] = v.z, b[set][jn * 4 + 3] = v.w;
        }
    };

    load_tile(0);
    store_tile(0);
    __syncthreads();
    load_fragments(0, 0, 0);
    int stage = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) load_tile(k0 + BK);  // issued now, stored only after this tile's arithmetic
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            if (k + 1 < BK) {
                load_fragments((k + 1) % 2, stage, k + 1);
            } else if (more) {  // last slice: store the next tile, then fetch its first slice
                store_tile(stage ^ 1);
                __syncthreads();
                load_fragments(0, stage ^ 1, 0);
            }
#pragma unroll
            for (int i = 0; i < WMITER * 4; ++i)
#pragma unroll
                for (int j = 0; j < WNITER * 4; ++j) acc[i][j] += a[k % 2][i] * b[k % 2][j];
        }
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
