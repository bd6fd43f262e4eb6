// Naive transpose: out[col][row] = in[row][col], straight from global memory.
//
// The reads are coalesced (a warp reads 32 neighbours of one row), but the writes are not: the 32
// threads of a warp write down one column of `out`, 4 * n bytes apart, 32 separate sectors.
#define TILE 32
#define BLOCK_ROWS 8

extern "C" __global__ void transpose_naive(const float *in, float *out, int n)
{
    int col = blockIdx.x * TILE + threadIdx.x;
    int row = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        out[(long)col * n + row + j] = in[(long)(row + j) * n + col];
    }
}
