// SGEMM step 1, naive: C = A B for row-major A (M x K), B (K x N), C (M x N); one thread per element of C.
//
// Thread x of a block takes a *row* of C. That is the natural first guess and the wrong one: the 32
// threads of a warp then read A[row][k] from 32 different rows, K floats apart, so each load of the
// warp touches 32 sectors to use 4 bytes of each; and they write C 32 rows apart. Launch with 32 x 32
// threads per block and ceil(M/32) x ceil(N/32) blocks.
extern "C" __global__ void sgemm_naive(const float *A, const float *B, float *C, int M, int N, int K)
{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    int col = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) {
            sum += A[row * K + k] * B[k * N + col];
        }
        C[row * N + col] = sum;
    }
}
