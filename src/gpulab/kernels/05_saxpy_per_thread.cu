// SAXPY with several elements per thread: the launch configuration explorer's kernel.
//
// Each thread handles `per_thread` elements, spaced one grid apart (gridDim.x * blockDim.x), so
// that in every pass the threads of a warp still touch 32 consecutive floats: the accesses stay
// coalesced however many elements a thread does. Fewer, longer-lived threads spend less time
// starting and retiring blocks; too few of them leave the memory system idle.
extern "C" __global__ void saxpy_per_thread(int n, float a, const float *__restrict__ x,
                                            float *__restrict__ y, int per_thread)
{
    long stride = (long)gridDim.x * blockDim.x;  // long: n may be close to 2^31
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < per_thread; ++k, i += stride) {
        if (i < n) {
            y[i] = a * x[i] + y[i];
        }
    }
}
