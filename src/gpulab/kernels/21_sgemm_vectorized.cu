// SGEMM step 6, vectorised loads: the 8 x 8 blocking of step 5 with 16-byte loads everywhere.
//
// Global memory: each thread loads a float4 of A and a float4 of B per tile (one instruction each
// instead of four). Shared memory: A's tile is stored *transposed*, As[k][m], so that a thread's 8
// floats of A's column are contiguous, like its 8 floats of B's row: each operand set is two 16-byte
// loads (LDS.128) instead of eight 4-byte ones. Per k, a thread now issues 4 shared loads for 64
// multiply-adds. C is written with float4 stores.
// Needs N and K to be multiples of 4 (16-byte aligned rows); M is free.
// Launch with ceil(N/128) x ceil(M/128) blocks of 256 threads.
#define BM 128
#define BN 128
#define BK 8
#define TM 8
#define TN 8
#define THREADS (BM * BN / (TM * TN))

__device__ __forceinline__ float4 load4(const float *p, bool inside)
{
    return inside ? *reinterpret_cast<const float4 *>(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

extern "C" __global__ void __launch_bounds__(THREADS) sgemm_vectorized(const float *A, const float *B, float *C,
                                                                       int M, int N, int K)
{
    __shared__ __align__(16) float As[BK][BM];  // transposed: As[k][m] = A[m][k]
    __shared__ __align__(16) float Bs[BK][BN];
    int t = threadIdx.x;
    int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    int tr = t / (BN / TN) * TM;
    int tc = t % (BN / TN) * TN;
    int ar = t / (BK / 4), ak = t % (BK / 4) * 4;  // A tile: 128 rows x 2 float4s
    int bk = t / (BN / 4), bc = t % (BN / 4) * 4;  // B tile: 8 rows x 32 float4s
    float acc[TM][TN] = {{0.0f}};
    for (int k0 = 0; k0 < K; k0 += BK) {
        float4 va = load4(A + (row0 + ar) * K + k0 + ak, row0 + ar < M && k0 + ak < K);
        As[ak + 0][ar] = va.x;
        As[ak + 1][ar] = va.y;
        As[ak + 2][ar] = va.z;
        As[ak + 3][ar] = va.w;
        *reinterpret_cast<float4 *>(&Bs[bk][bc]) = load4(B + (k0 + bk) * N + col0 + bc, k0 + bk < K && col0 + bc < N);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float4 a0 = *reinterpret_cast<const float4 *>(&As[k][tr]);
            float4 a1 = *reinterpret_cast<const float4 *>(&As[k][tr + 4]);
            float4 b0 = *reinterpret_cast<const float4 *>(&Bs[k][tc]);
            float4 b1 = *reinterpret_cast<const float4 *>(&Bs[k][tc + 4]);
            float a[TM] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            float b[TN] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        int row = row0 + tr + i;
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
            int col = col0 + tc + j;
            if (row < M && col < N) {
                *reinterpret_cast<float4 *>(&C[row * N + col]) =
                    make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
            }
        }
    }
}
