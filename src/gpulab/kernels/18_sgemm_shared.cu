// SGEMM step 3, shared-memory tiling: a block of 32 x 32 threads computes a 32 x 32 tile of C.
//
// The block walks along K in steps of 32. At each step every thread loads one element of a 32 x 32
// tile of A and one of B into shared memory; after a barrier, each thread runs 32 multiply-adds out
// of shared memory. Every float loaded from global memory is now used 32 times instead of once.
// But each multiply-add still reads two floats from shared memory: shared memory's bandwidth is now
// the limit. Elements past the edges of A and B load as zeros, so any M, N, K works.
// Launch with ceil(N/32) x ceil(M/32) blocks of 32 x 32 threads.
#define TILE 32

extern "C" __global__ void sgemm_shared(const float *A, const float *B, float *C, int M, int N, int K)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float sum = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A[row * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(k0 + ty) * N + col] : 0.0f;
        __syncthreads();  // both tiles are complete
#pragma unroll
        for (int k = 0; k < TILE; ++k) {
            sum += As[ty][k] * Bs[k][tx];
        }
        __syncthreads();  // nobody reads the tiles any more: the next step may overwrite them
    }
    if (row < M && col < N) {
        C[row * N + col] = sum;
    }
}
