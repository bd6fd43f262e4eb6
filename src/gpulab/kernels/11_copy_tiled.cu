// A copy with the transpose kernels' tiling: the speed limit for the three transposes that follow.
//
// Every transpose kernel works on TILE x TILE tiles with blocks of TILE x BLOCK_ROWS threads, each
// thread handling TILE / BLOCK_ROWS elements. This kernel reads and writes the same tiles in the same
// order, without transposing: whatever the transposes lose against it is the cost of transposing.
// __restrict__ promises that `in` and `out` do not overlap, so the compiler may issue all of a
// thread's loads before its stores (more bytes in flight); without it each load waits for the
// previous store, and this copy measured slower than the padded transpose on an H200.
// The matrix is n x n, row-major, with n a multiple of TILE.
#define TILE 32
#define BLOCK_ROWS 8

extern "C" __global__ void copy_tiled(const float *__restrict__ in, float *__restrict__ out, int n)
{
    int col = blockIdx.x * TILE + threadIdx.x;
    int row = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        out[(long)(row + j) * n + col] = in[(long)(row + j) * n + col];
    }
}
