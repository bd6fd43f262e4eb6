// SGEMM step 2, coalesced: the same arithmetic with thread x taking a *column* of C.
//
// Now the 32 threads of a warp read 32 neighbouring floats of a row of B (one 128-byte request) and
// the same element of A (one broadcast), and write 32 neighbouring floats of C. Nothing else changed:
// every multiply-add still loads two floats from global memory (through L1 and L2), so the kernel is
// bound by the caches' bandwidth, far from the arithmetic units. Launch with ceil(N/32) x ceil(M/32)
// blocks of 32 x 32 threads.
extern "C" __global__ void sgemm_coalesced(const float *A, const float *B, float *C, int M, int N, int K)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) {
            sum += A[row * K + k] * B[k * N + col];
        }
        C[row * N + col] = sum;
    }
}
