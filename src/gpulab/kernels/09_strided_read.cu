// Coalescing: out[i] = in[i * stride].
//
// Memory moves in 32-byte sectors. With stride 1 the 32 threads of a warp read 128 consecutive
// bytes: four sectors, every byte used. With stride s each thread's 4 bytes sit s * 4 bytes apart,
// so up to 32 sectors are fetched for the same 128 useful bytes. The writes stay contiguous.
extern "C" __global__ void strided_read(const float *in, float *out, int n, int stride)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = in[(long)i * stride];  // long: i * stride can pass 2^31
    }
}
