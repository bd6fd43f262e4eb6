// Tensor cores, step 2: WMMA fed from shared memory through an asynchronous pipeline.
//
// Step 1 keeps the tensor cores waiting: each warp fetches its own fragments from global memory, and a
// 16 x 16 x 16 multiply-add takes the tensor cores so little time that the loads are the whole cost.
// This kernel applies to tensor cores what the SGEMM worklog taught for CUDA cores:
//
// - Blocking. A block of THREADS owns a BM x BN tile of C; each warp a WM x WN part of it, as
//   (WM/16) x (WN/16) accumulator fragments held in registers for the whole K loop. Per 16-deep slice a
//   warp loads WM/16 fragments of A and WN/16 of B and does (WM/16)(WN/16) matrix instructions: with
//   64 x 64 warp tiles, 8 loads feed 16 instructions, and each value read from shared memory serves 4.
// - Shared memory with padded rows. A BM x BK tile of A and a BK x BN tile of B are staged in shared
//   memory. Each row is SKEW = 8 halves (16 bytes) longer than the tile: the fragment loads read 16-byte
//   pieces of 8 consecutive rows at once, and the skew puts those pieces in 8 different groups of banks.
// - An asynchronous pipeline of STAGES tiles. cp.async (Ampere and later) copies 16 bytes from global to
//   shared memory without passing through registers, and lets the thread go on. While the tensor cores
//   work on tile t, the copies of tiles t+1 ... t+STAGES-1 are in flight. cp.async.wait_group waits until
//   at most STAGES-2 groups of copies are still pending, i.e. tile t has landed.
//
// Two options, off by default, for the sweep to try: GROUP_M > 1 orders the blocks so that neighbours in launch
// order work on GROUP_M rows of tiles (more reuse of A and B in L2); STAGED_EPILOGUE = 1 writes C through shared
// memory, so that each warp stores whole rows in 16-byte pieces instead of the fragments' 8-byte ones.
//
// The sizes are macros, so that a sweep can compile variants with -D. Needs M, N and K to be multiples
// of 16 (the edges of the block tile are zero-filled and their stores skipped). Launch with
// ceil(N/BN) x ceil(M/BM) blocks of THREADS threads and SHARED_BYTES of dynamic shared memory.
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 32
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 64
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef GROUP_M  // block rasterization: consecutive blocks walk down GROUP_M rows of tiles (1: row by row)
#define GROUP_M 1
#endif
#ifndef STAGED_EPILOGUE  // 1: write C through shared memory, in whole 16-byte pieces per lane
#define STAGED_EPILOGUE 0
#endif
#define WARPS_N (BN / WN)
#define THREADS (32 * (BM / WM) * (BN / WN))
#define FM (WM / 16)  // accumulator fragments per warp, down
#define FN (WN / 16)  // ... and across
#define SKEW 8
#define LDA (BK + SKEW)  // row length of a staged tile of A, in halves
#define LDB (BN + SKEW)
#define A_STAGE (BM * LDA)
#define B_STAGE (BK * LDB)
#define LDC (WN + 4)  // row length, in floats, of a warp's staged tile of C (16 bytes of padding)
#define PIPELINE_BYTES (STAGES * (A_STAGE + B_STAGE) * 2)
#define EPILOGUE_BYTES (STAGED_EPILOGUE ? THREADS / 32 * WM * LDC * 4 : 0)
#define SHARED_BYTES (PIPELINE_BYTES > EPILOGUE_BYTES ? PIPELINE_BYTES : EPILOGUE_BYTES)
#define CHUNKS_A (BM * BK / 8)  // 16-byte pieces (8 halves) of a tile of A
#define CHUNKS_B (BK * BN / 8)

static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "tile sizes");
static_assert(CHUNKS_A % THREADS == 0 && CHUNKS_B % THREADS == 0, "whole 16-byte pieces per thread");
static_assert(STAGES >= 2, "a pipeline needs at least two stages");

typedef unsigned short half_bits;  // the bits of one IEEE float16

// The fragment loads name the shared state space and take a 32-bit shared-memory address: from a generic
// pointer the compiler cannot tell shared from global memory, and falls back on slow generic loads. With
// .shared it emits ldmatrix, which loads a whole 8 x 8 tile of 16-bit values per warp instruction.
__device__ __forceinline__ void load_a(unsigned (&a)[8], unsigned address, int ld)  // 16 x 16 of A, row-major
{
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]), "=r"(a[4]), "=r"(a[5]), "=r"(a[6]), "=r"(a[7])
                 : "r"(address), "r"(ld) : "memory");
}

__device__ __forceinline__ void load_b(unsigned (&b)[8], unsigned address, int ld)  // 16 x 16 of B, row-major
{
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.shared.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]), "=r"(b[4]), "=r"(b[5]), "=r"(b[6]), "=r"(b[7])
                 : "r"(address), "r"(ld) : "memory");
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

__device__ __forceinline__ void store_c_shared(unsigned address, const float (&d)[8], int ld)  // ... to shared memory
{
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;"
                 :: "r"(address), "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]), "f"(d[4]), "f"(d[5]), "f"(d[6]),
                    "f"(d[7]), "r"(ld) : "memory");
}

// 16 bytes from global memory to the shared-memory address, asynchronously; zeros where the piece lies outside.
__device__ __forceinline__ void copy16(unsigned address, const half_bits *global, bool inside)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(address), "l"(global), "r"(inside ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }

__device__ __forceinline__ void wait_for_all_but_newest_copies()  // all but the STAGES-2 newest groups landed
{
    asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS)
    wmma_gemm_pipelined(const half_bits *__restrict__ A, const half_bits *__restrict__ B, float *__restrict__ C,
                        int M, int N, int K)
{
    extern __shared__ __align__(128) half_bits shared[];
    // Shared-memory addresses (bytes) of the stages of A, then of B.
    const unsigned As = static_cast<unsigned>(__cvta_generic_to_shared(shared)), Bs = As + STAGES * A_STAGE * 2;
    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    int tile_m = blockIdx.y, tile_n = blockIdx.x;
    if (GROUP_M > 1) {  // blocks start in launch order: let neighbours in that order share tiles of A and B in L2
        const int id = blockIdx.y * gridDim.x + blockIdx.x, in_group = id % (GROUP_M * gridDim.x);
        const int first = id / (GROUP_M * gridDim.x) * GROUP_M, rows = min(GROUP_M, (int)gridDim.y - first);
        tile_m = first + in_group % rows, tile_n = in_group / rows;
    }
    const int row0 = tile_m * BM, col0 = tile_n * BN;
    const int wr = warp / WARPS_N * WM, wc = warp % WARPS_N * WN;
    const int tiles = (K + BK - 1) / BK;

    auto load_tile = [&](int stage, int k0) {  // every thread issues its share of the copies of one stage
        const unsigned as = As + stage * A_STAGE * 2, bs = Bs + stage * B_STAGE * 2;
#pragma unroll
        for (int i = 0; i < CHUNKS_A / THREADS; ++i) {
            const int c = t + i * THREADS, r = c / (BK / 8), kk = c % (BK / 8) * 8;
            const bool inside = row0 + r < M && k0 + kk < K;
            copy16(as + (r * LDA + kk) * 2, inside ? A + (size_t)(row0 + r) * K + k0 + kk : A, inside);
        }
#pragma unroll
        for (int i = 0; i < CHUNKS_B / THREADS; ++i) {
            const int c = t + i * THREADS, kk = c / (BN / 8), cc = c % (BN / 8) * 8;
            const bool inside = k0 + kk < K && col0 + cc < N;
            copy16(bs + (kk * LDB + cc) * 2, inside ? B + (size_t)(k0 + kk) * N + col0 + cc : B, inside);
        }
    };

    float acc[FM][FN][8];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[i][j][e] = 0.0f;

    for (int s = 0; s < STAGES - 1; ++s) {  // fill the pipeline: tiles 0 ... STAGES-2 in flight
        if (s < tiles) load_tile(s, s * BK);
        commit_copies();  // one group per tile, empty past the last, so that the count below stays right
    }
    for (int tile = 0; tile < tiles; ++tile) {
        wait_for_all_but_newest_copies();  // this thread's copies of tile `tile` have landed ...
        __syncthreads();                   // ... and everyone's; and everyone is done with tile - 1's stage
        const int next = tile + STAGES - 1;
        if (next < tiles) load_tile(next % STAGES, next * BK);  // refills the stage that tile - 1 used
        commit_copies();
        const unsigned as = As + (tile % STAGES) * A_STAGE * 2, bs = Bs + (tile % STAGES) * B_STAGE * 2;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned a[FM][8], b[FN][8];
#pragma unroll
            for (int i = 0; i < FM; ++i) load_a(a[i], as + ((wr + i * 16) * LDA + kk) * 2, LDA);
#pragma unroll
            for (int j = 0; j < FN; ++j) load_b(b[j], bs + (kk * LDB + wc + j * 16) * 2, LDB);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) mma(acc[i][j], a[i], b[j]);
        }
    }
    if (STAGED_EPILOGUE) {  // each warp stages its WM x WN tile of C, then writes whole rows with 16-byte stores
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();  // every warp is done with the pipeline's shared memory, which the staging reuses
        const unsigned staged = As + warp * WM * LDC * 4;
#pragma unroll
        for (int i = 0; i < FM; ++i)
#pragma unroll
            for (int j = 0; j < FN; ++j) store_c_shared(staged + (i * 16 * LDC + j * 16) * 4, acc[i][j], LDC);
        __syncwarp();
        const float *tile = reinterpret_cast<const float *>(shared) + warp * WM * LDC;
#pragma unroll 4
        for (int e = lane; e < WM * WN / 4; e += 32) {  // a warp writes 512 contiguous bytes per step
            const int r = e / (WN / 4), c = e % (WN / 4) * 4, row = row0 + wr + r, col = col0 + wc + c;
            if (row < M && col < N)
                *reinterpret_cast<float4 *>(C + (size_t)row * N + col) =
                    *reinterpret_cast<const float4 *>(tile + r * LDC + c);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < FM; ++i) {
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            const int row = row0 + wr + i * 16, col = col0 + wc + j * 16;
            if (row < M && col < N) store_c(C + (size_t)row * N + col, acc[i][j], N);  // M, N: multiples of 16
        }
    }
}
