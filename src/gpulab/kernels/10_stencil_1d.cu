// The 1D stencil of radius 3: out[i] = in[i] + in[i+1] + ... + in[i+6], 7 inputs per output.
//
// Each input is read by 7 threads, so a block first copies the inputs it needs into shared memory:
// its own BLOCK_SIZE elements plus a halo of RADIUS on each side, BLOCK_SIZE + 2 * RADIUS in all
// (the threads take them in turn, so the last, partly empty block works too). __syncthreads() then
// waits until every thread of the block has stored its part; without it a thread may read a slot
// that a neighbour has not written yet. `use_barrier` = 0 drops the barrier, to show what breaks.
// `in` holds n + 2 * RADIUS elements. Launch with BLOCK_SIZE threads per block.
#define RADIUS 3
#define BLOCK_SIZE 256

extern "C" __global__ void stencil_1d(const float *in, float *out, int n, int use_barrier)
{
    __shared__ float window[BLOCK_SIZE + 2 * RADIUS];
    int first = blockIdx.x * BLOCK_SIZE;  // window[j] holds in[first + j]

    for (int j = threadIdx.x; j < BLOCK_SIZE + 2 * RADIUS; j += BLOCK_SIZE) {
        if (first + j < n + 2 * RADIUS) {
            window[j] = in[first + j];
        }
    }
    if (use_barrier) {
        __syncthreads();
    }
    int i = first + threadIdx.x;
    if (i < n) {
        float sum = 0.0f;
        for (int offset = 0; offset <= 2 * RADIUS; ++offset) {
            sum += window[threadIdx.x + offset];
        }
        out[i] = sum;
    }
}
