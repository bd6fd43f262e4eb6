// SGEMM step 5, 2D register blocking: each thread computes an 8 x 8 block of C.
//
// A block of 256 threads computes a 128 x 128 tile of C, walking along K in steps of BK = 8. At each k a
// thread loads 8 floats of A's column and 8 of B's row from shared memory into registers and
// multiplies every pair: 64 multiply-adds for 16 shared-memory reads (the outer product, as in
// MAGMA's register-blocked GEMM). Each float loaded from global memory is used 128 times.
// The 64 accumulators, 16 operands and addresses take about 128 registers per thread.
// Launch with ceil(N/128) x ceil(M/128) blocks of 256 threads.
#define BM 128
#define BN 128
#define BK 8
#define TM 8
#define TN 8
#define THREADS (BM * BN / (TM * TN))

extern "C" __global__ void __launch_bounds__(THREADS) sgemm_2d_blocking(const float *A, const float *B, float *C,
                                                                        int M, int N, int K)
{
    __shared__ float As[BM][BK];
    __shared__ float Bs[BK][BN];
    int t = threadIdx.x;
    int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    int tr = t / (BN / TN) * TM;  // this thread's first row and column in the tile
    int tc = t % (BN / TN) * TN;
    float acc[TM][TN] = {{0.0f}};
    float a[TM], b[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int e = t; e < BM * BK; e += THREADS) {  // 4 elements of each tile per thread
            int ar = e / BK, ak = e % BK;
            As[ar][ak] = (row0 + ar < M && k0 + ak < K) ? A[(row0 + ar) * K + k0 + ak] : 0.0f;
            int bk = e / BN, bc = e % BN;
            Bs[bk][bc] = (k0 + bk < K && col0 + bc < N) ? B[(k0 + bk) * N + col0 + bc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[tr + i][k];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tc + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            int row = row0 + tr + i, col = col0 + tc + j;
            if (row < M && col < N) C[row * N + col] = acc[i][j];
        }
    }
}
