// SGEMM step 4, 1D register blocking: each thread computes TM = 8 elements of a column of C.
//
// A block of 512 threads computes a 64 x 64 tile of C, walking along K in steps of BK = 8. At each k a
// thread reads one float of B from shared memory into a register and reuses it for its 8 outputs,
// and reads 8 floats of A that all 32 threads of its warp share (one broadcast each). Shared-memory
// reads per multiply-add drop from 2 to 9/8, and the 8 independent accumulators keep the arithmetic
// units busy. Launch with ceil(N/64) x ceil(M/64) blocks of 512 threads.
#define BM 64
#define BN 64
#define BK 8
#define TM 8
#define THREADS (BM * BN / TM)

extern "C" __global__ void __launch_bounds__(THREADS) sgemm_1d_blocking(const float *A, const float *B, float *C,
                                                                        int M, int N, int K)
{
    __shared__ float As[BM][BK];
    __shared__ float Bs[BK][BN];
    int t = threadIdx.x;
    int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    int tc = t % BN;       // this thread's column of the tile
    int tr = t / BN * TM;  // and the first of its TM rows
    float acc[TM] = {0.0f};
    for (int k0 = 0; k0 < K; k0 += BK) {
        // BM * BK = BK * BN = 512 elements per tile: one element of each per thread
        int ar = t / BK, ak = t % BK;
        As[ar][ak] = (row0 + ar < M && k0 + ak < K) ? A[(row0 + ar) * K + k0 + ak] : 0.0f;
        int bk = t / BN, bc = t % BN;
        Bs[bk][bc] = (k0 + bk < K && col0 + bc < N) ? B[(k0 + bk) * N + col0 + bc] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float b = Bs[k][tc];
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                acc[i] += As[tr + i][k] * b;
            }
        }
        __syncthreads();
    }
    int col = col0 + tc;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        int row = row0 + tr + i;
        if (row < M && col < N) {
            C[row * N + col] = acc[i];
        }
    }
}
