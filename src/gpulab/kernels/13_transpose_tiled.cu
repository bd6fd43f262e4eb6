// Tiled transpose: read a tile into shared memory row by row, write it out column by column.
//
// Both global accesses are now coalesced: a warp reads a row of the input tile and writes a row of
// the output tile. The transposition happens in shared memory, where a warp reads a *column* of
// `tile`: 32 floats that are 32 floats apart. Shared memory has 32 banks of 4 bytes, and word w sits
// in bank w % 32, so the whole column lies in one bank: a 32-way bank conflict, served one word at a
// time.
#define TILE 32
#define BLOCK_ROWS 8

extern "C" __global__ void transpose_tiled(const float *in, float *out, int n)
{
    __shared__ float tile[TILE][TILE];
    int col = blockIdx.x * TILE + threadIdx.x;
    int row = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        tile[threadIdx.y + j][threadIdx.x] = in[(long)(row + j) * n + col];
    }
    __syncthreads();  // the whole tile must be in before any thread reads a column of it

    col = blockIdx.y * TILE + threadIdx.x;  // the output tile sits at the mirrored block position
    row = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        out[(long)(row + j) * n + col] = tile[threadIdx.x][threadIdx.y + j];
    }
}
