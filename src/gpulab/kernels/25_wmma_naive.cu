// Tensor cores, step 1: the WMMA API at its simplest. C = A B with float16 A and B, float32 C.
//
// A tensor core multiplies small matrices: one warp-wide matrix instruction computes D = A B + C on a
// 16 x 16 x 16 tile, 4,096 multiply-adds, where a CUDA core does one. WMMA ("warp matrix multiply-
// accumulate") exposes it to CUDA C as *fragments*: a 16 x 16 tile of A, of B or of the accumulator, spread
// over the 32 threads of a warp in a layout the hardware chooses. Each thread holds 8 registers of a
// fragment (eight pairs of float16 for A and B, eight float32 for the accumulator). Every instruction
// below is executed by the whole warp together ("sync.aligned"): no thread may skip it.
//
// C++ offers these as nvcuda::wmma::load_matrix_sync, mma_sync and store_matrix_sync (the header mma.h);
// here they are written as the PTX instructions those functions compile to, so that the kernel needs
// no CUDA headers and NVRTC compiles it anywhere. A float16 is passed around as its 16 bits.
//
// One warp computes one 16 x 16 tile of C, and reads its fragments of A and B straight from global
// memory: no shared memory, no reuse between warps. Four warps per block, a 2 x 2 square of tiles.
// M, N and K must be multiples of 16. Launch with ceil(N/32) x ceil(M/32) blocks of 128 threads.
typedef unsigned short half_bits;  // the bits of one IEEE float16

__device__ __forceinline__ void load_a(unsigned (&a)[8], const half_bits *p, int ld)  // 16 x 16 of A, row-major
{
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.global.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]), "=r"(a[4]), "=r"(a[5]), "=r"(a[6]), "=r"(a[7])
                 : "l"(p), "r"(ld) : "memory");
}

__device__ __forceinline__ void load_b(unsigned (&b)[8], const half_bits *p, int ld)  // 16 x 16 of B, row-major
{
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.global.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]), "=r"(b[4]), "=r"(b[5]), "=r"(b[6]), "=r"(b[7])
                 : "l"(p), "r"(ld) : "memory");
}

__device__ __forceinline__ void mma(float (&d)[8], const unsigned (&a)[8], const unsigned (&b)[8])  // d += a b
{
    asm volatile("wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19, %20, %21, %22, %23}, "
                 "{%0, %1, %2, %3, %4, %5, %6, %7};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]), "r"(a[6]), "r"(a[7]),
                   "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(b[4]), "r"(b[5]), "r"(b[6]), "r"(b[7]));
}

__device__ __forceinline__ void store_c(float *p, const float (&d)[8], int ld)  // 16 x 16 of C, row-major
{
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.global.f32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;"
                 :: "l"(p), "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]), "f"(d[4]), "f"(d[5]), "f"(d[6]), "f"(d[7]),
                    "r"(ld) : "memory");
}

extern "C" __global__ void wmma_gemm_naive(const half_bits *A, const half_bits *B, float *C, int M, int N, int K)
{
    const int warp = threadIdx.x / 32;
    const int row = (blockIdx.y * 2 + warp / 2) * 16, col = (blockIdx.x * 2 + warp % 2) * 16;
    if (row >= M || col >= N) return;  // the whole warp leaves together, as the sync instructions require
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < K; k += 16) {
        unsigned a[8], b[8];
        load_a(a, A + (size_t)row * K + k, K);  // rows row..row+15 of A, columns k..k+15
        load_b(b, B + (size_t)k * N + col, N);  // rows k..k+15 of B, columns col..col+15
        mma(acc, a, b);                         // 4,096 multiply-adds in one warp instruction
    }
    store_c(C + (size_t)row * N + col, acc, N);
}
