// Latency hiding: a copy whose grid is deliberately too small, so that the bytes in flight are known.
//
// A fixed number of threads loops over the array (a grid-stride loop). Each thread issues
// `loads` independent 16-byte loads before it stores any of them, so at any moment about
// threads * loads * 16 bytes are on their way from memory. By Little's law the bandwidth is at most
// (bytes in flight) / (memory latency), until it reaches the memory's peak.
#define MAX_LOADS 8

extern "C" __global__ void copy_in_flight(const float4 *__restrict__ in, float4 *__restrict__ out,
                                          int n4, int loads)
{
    int threads = gridDim.x * blockDim.x;
    int first = blockIdx.x * blockDim.x + threadIdx.x;
    for (int base = first; base < n4; base += threads * loads) {
        float4 held[MAX_LOADS];
#pragma unroll
        for (int k = 0; k < MAX_LOADS; ++k) {  // issue all loads first: they overlap in flight
            int i = base + k * threads;
            if (k < loads && i < n4) {
                held[k] = in[i];
            }
        }
#pragma unroll
        for (int k = 0; k < MAX_LOADS; ++k) {
            int i = base + k * threads;
            if (k < loads && i < n4) {
                out[i] = held[k];
            }
        }
    }
}
