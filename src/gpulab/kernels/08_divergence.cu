// Warp divergence: groups of `group` consecutive threads take one of two different loops.
//
// A warp issues one instruction for all its 32 threads. When group < 32, both paths occur inside
// every warp: the warp runs the first loop with half its threads masked off, then the second
// loop with the other half, and takes the time of both. When group >= 32 each warp takes a single
// path. The loops do different operations (a multiply-add, a square root) so that the compiler
// cannot merge them into one loop with selected constants.
extern "C" __global__ void divergent_paths(float *x, int n, int iterations, int group)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    float v = x[i];
    if ((threadIdx.x / group) % 2 == 0) {
        for (int k = 0; k < iterations; ++k) {
            v = v * v * 0.5f + 0.25f;
        }
    } else {
        for (int k = 0; k < iterations; ++k) {
            v = sqrtf(v + 1.0f) - 0.5f;
        }
    }
    x[i] = v;
}
