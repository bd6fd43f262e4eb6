// Vector addition: thread i computes C[i] = A[i] + B[i].
//
// Launched with blocks of M threads and (N + M - 1) / M blocks, so that there are at least N
// threads; the last block may have threads past the end of the arrays, which the bounds check
// keeps from reading or writing memory that is not theirs.
extern "C" __global__ void vector_add(const float *A, const float *B, float *C, int N)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // this thread's element: block offset + position in block
    if (i < N) {
        C[i] = A[i] + B[i];
    }
}
