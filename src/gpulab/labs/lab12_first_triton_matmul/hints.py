"""What each kind of mistake should make the student look at, per exercise of the lab: {problem: hint}.

The problems are those of :class:`.diagnose.Diagnosis`; :func:`gpulab.labs.grading.grade` prints the hint of the
problem a diagnosis found, after what came back and what was expected.
"""

from __future__ import annotations

KERNEL = {
    "not answered": "write the body of blocked_kernel where it says YOUR CODE HERE: the tile from tl.program_id, "
                    "the addresses of A and B, the K loop with tl.dot, the masked store (section 1 shows each piece)",
    "no k mask": "the loads along K have no mask: in the last step of the K loop only K - k * BLOCK_K columns of A "
                 "(rows of B) are left, so load with mask=offs_k[None, :] < K - k * BLOCK_K for A and "
                 "offs_k[:, None] < K - k * BLOCK_K for B, and other=0.0 (a mask of offs_k < K is true everywhere "
                 "once K > BLOCK_K)",
    "short k loop": "the K loop must run tl.cdiv(K, BLOCK_K) steps: K // BLOCK_K drops the last, partial tile",
    "pointers not advanced": "the pointers never move along K: at the end of each step add BLOCK_K * stride_ak to "
                             "a_ptrs and BLOCK_K * stride_bk to b_ptrs",
    "a strides swapped": "in A's addresses the row index goes with stride_am and the K index with stride_ak: "
                         "a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak",
    "b strides swapped": "in B's addresses the K index goes with stride_bk and the column index with stride_bn: "
                         "b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn",
    "c strides swapped": "in C's addresses the row index goes with stride_cm and the column index with stride_cn: "
                         "c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn",
    "no store mask": "the store needs a mask: mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), so that the tiles "
                     "at C's bottom and right edges store only the part of their tile inside C",
    "store mask rows only": "the store mask must check the columns too: (offs_m[:, None] < M) & (offs_n[None, :] < N); "
                            "a store at a column past N lands in the next row of C, or past its end",
    "store mask columns only": "the store mask must check the rows too: (offs_m[:, None] < M) & "
                               "(offs_n[None, :] < N); the last row of tiles reaches past C's last row",
    "program ids swapped": "the grid's axis 0 counts the rows of tiles: pid_m = tl.program_id(0) and "
                           "pid_n = tl.program_id(1), as blocked_grid returns (tiles along M, tiles along N)",
    "16-bit sums": "keep the running sum in float32: acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) and "
                   "acc = tl.dot(a, b, acc); round to C's type once, at the store (acc.to(c_ptr.dtype.element_ty))",
    "out of bounds": "a store reached past C: every store needs the mask (offs_m[:, None] < M) & "
                     "(offs_n[None, :] < N), and C's addresses use stride_cm for the rows and stride_cn for the "
                     "columns",
    "unwritten": "every program stores its whole tile, masked only where the tile leaves C: look at the store's "
                 "mask, and at pid_m = tl.program_id(0), pid_n = tl.program_id(1) (offs_m = pid_m * BLOCK_M + "
                 "tl.arange(0, BLOCK_M))",
    "input written": "the kernel may store into C only: tl.store(c_ptrs, ...), never into a_ptrs or b_ptrs",
    "wrong values": "go through the steps: offsets of the tile's rows and columns from the program ids, A's and "
                    "B's addresses with their strides, a K loop of tl.cdiv(K, BLOCK_K) masked steps that adds "
                    "tl.dot(a, b) to a float32 acc and moves both pointers by BLOCK_K, then the masked store",
    "error": "the kernel failed in Triton: read the error and the line it names; tl.dot needs tiles of at least "
             "16 x 16 and an accumulator of the shape (BLOCK_M, BLOCK_N)",
}

GRID = {
    "not answered": "return the grid: a tuple with one whole number of programs per axis",
    "grid axes swapped": "axis 0 of the grid is tl.program_id(0), which the kernel uses for the row of tiles: "
                         "(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))",
    "grid too small": "one program per tile, rounding up: triton.cdiv(M, BLOCK_M) tiles down C, "
                      "triton.cdiv(N, BLOCK_N) across; M // BLOCK_M leaves the last, partial tiles out",
    "grid too large": "one program per tile, no more: triton.cdiv(M, BLOCK_M) is M / BLOCK_M rounded up "
                      "(M // BLOCK_M + 1 is one too many when M is a multiple of BLOCK_M)",
    "grid not 1-D": "the grouped kernel has one axis: (tiles,) with tiles = triton.cdiv(M, BLOCK_M) * "
                    "triton.cdiv(N, BLOCK_N); grouped_tile turns the program id into the tile's row and column",
    "not a grid": "return a tuple of whole numbers, one per axis of the grid: triton.cdiv(a, b) rounds a / b up "
                  "and stays an int",
    "error": "the grid function takes (M, N, BLOCK_M, BLOCK_N) and returns a tuple of whole numbers",
}

NUMBERING = {
    "not answered": "write grouped_tile's body from the list above: tiles_m, tiles_n, tiles_per_group, first_m, "
                    "rows_in_group, within, then pid_m and pid_n; return pid_m, pid_n",
    "last group not clamped": "the last group may have fewer than GROUP_M rows of tiles: rows_in_group = "
                              "min(tiles_m - first_m, GROUP_M), and both pid_m and pid_n use it",
    "row not wrapped": "take the id's place in its group first, within = tile_id % tiles_per_group, then "
                       "pid_m = first_m + within % rows_in_group (tile_id % rows_in_group goes wrong in a short "
                       "last group)",
    "column divided by GROUP_M": "pid_n = within // rows_in_group: in the last group the columns hold "
                                 "rows_in_group tiles each, not GROUP_M",
    "group spans rows": "a group is GROUP_M rows of tiles across all the columns: tiles_per_group = "
                        "GROUP_M * tiles_n, with tiles_n = tl.cdiv(N, BLOCK_N)",
    "outside C": "every id must give a tile inside C: pid_m below tiles_m and pid_n below tiles_n; check how the "
                 "last, shorter group is handled (rows_in_group)",
    "not one program per tile": "the numbering must give every tile to exactly one id: check tiles_per_group, "
                                "first_m = (tile_id // tiles_per_group) * GROUP_M, and that pid_m and pid_n both "
                                "divide by rows_in_group",
    "row-major order": "inside a group the ids go down the GROUP_M rows of one column of tiles before moving to the "
                       "next column: pid_m = first_m + within % rows_in_group, pid_n = within // rows_in_group",
    "grid order": "number the tiles group by group: group = tile_id // (GROUP_M * tiles_n), then down the rows of "
                  "the group, column after column",
    "not grouped order": "follow the numbering of the text: groups of GROUP_M rows of tiles; inside a group, down "
                         "a column of tiles, then the next column",
    "error": "grouped_tile(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M) is a @triton.jit function that returns two "
             "values, (pid_m, pid_n); the error names the line",
}

GROUPED_KERNEL = {
    **KERNEL,
    "not answered": "write grouped_kernel's body: pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, "
                    "BLOCK_N, GROUP_M), then the rest of your blocked_kernel",
    "unwritten": "the grouped kernel runs on a 1-D grid: take pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, "
                 "BLOCK_M, BLOCK_N, GROUP_M), and then compute the tile as in exercise 1",
    "program ids swapped": KERNEL["program ids swapped"],
    "error": "grouped_kernel takes the arguments of blocked_kernel and GROUP_M: tl.constexpr; the error names the "
             "line",
}

CONFIG = {
    "not answered": "set PIPELINED to a dict of BLOCK_M, BLOCK_N, BLOCK_K, num_warps and num_stages",
    "not a config": "a dict: dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3), say",
    "bad setting": "tile sides are powers of two of at least 16, num_warps is 4 or 8, and every value is a "
                   "positive int",
    "one stage": "pipelining is num_stages of 2 or more: the loads of the next steps are issued while the tensor "
                 "cores work on this one",
    "small tiles": "take BLOCK_M and BLOCK_N of 64 or more: 64 rows for Hopper's warpgroup MMA, and a larger tile "
                   "does more multiply-adds per byte it loads",
    "too much shared memory": "every stage holds a BLOCK_M x BLOCK_K tile of A and a BLOCK_K x BLOCK_N tile of B: "
                              "fewer stages or smaller tiles",
}

SHARED_BYTES = {
    "not answered": "return the bytes of the ring: num_stages slots, each a tile of A and a tile of B",
    "stages not counted": "every stage has its own slot: multiply by num_stages",
    "bits, not bytes": "count bytes: element_bytes is already in bytes (2 for float16)",
    "kibibytes": "return bytes, not KiB (the printout divides by 1024 itself)",
    "element size not counted": "multiply the elements by element_bytes (2 for float16)",
    "one tile only": "a stage holds both tiles: BLOCK_M x BLOCK_K of A and BLOCK_K x BLOCK_N of B",
    "C tile counted": "the accumulator (the C tile) lives in registers, not in the shared memory of the stages",
    "wrong count": "num_stages x (BLOCK_M x BLOCK_K + BLOCK_K x BLOCK_N) x element_bytes",
    "not a number": "return a number of bytes",
    "error": "pipeline_shared_bytes(BLOCK_M, BLOCK_N, BLOCK_K, num_stages, element_bytes) returns a number",
}

ASYNC_COPY = {
    "not answered": "set ASYNC_COPY to the name of an instruction in the table, as a string",
    "not an instruction": "answer with one of the instruction names in the table's columns, as a string",
    "not the new instruction": "compare the rows of the table: which load from global memory has a count of 0 "
                               "with one stage and above 0 with two or more?",
    "not compiled": "run the cell that compiles your kernel; it needs your blocked_kernel from exercise 1",
}
