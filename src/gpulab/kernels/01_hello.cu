// Hello from the GPU: every thread signs a guest book.
//
// The course's first kernel calls printf. Device printf writes to the process's terminal, which a
// notebook cell never shows, so here each thread takes the next free line of a guest book
// (atomicAdd hands out line numbers one at a time) and writes its block and thread index there.
// The host prints the book: "Hello World from GPU!" once per thread, in the order they arrived.
extern "C" __global__ void hello(int *line_count, int *block_of_line, int *thread_of_line)
{
    int line = atomicAdd(line_count, 1);  // returns the old value: each thread gets its own line
    block_of_line[line] = blockIdx.x;
    thread_of_line[line] = threadIdx.x;
}
