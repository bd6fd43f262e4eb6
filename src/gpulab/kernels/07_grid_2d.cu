// Who wrote which element: a 2D grid of 2D blocks over a matrix of `rows` x `cols` int32.
//
// x runs along a row (the column index), y down the columns (the row index): consecutive
// threadIdx.x are neighbours in memory, which keeps a warp's accesses together. Each thread writes
// its block and thread coordinates into its element, one plane per coordinate.
extern "C" __global__ void who_wrote(int *owner, int rows, int cols)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < rows && col < cols) {
        int element = row * cols + col;  // row-major
        int plane = rows * cols;
        owner[0 * plane + element] = blockIdx.x;
        owner[1 * plane + element] = blockIdx.y;
        owner[2 * plane + element] = threadIdx.x;
        owner[3 * plane + element] = threadIdx.y;
    }
}
