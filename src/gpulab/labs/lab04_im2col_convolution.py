"""Graders of the lab "im2col convolution" (``labs/04_im2col_convolution.ipynb``): the output size, im2col without
and with stride and padding, the GEMM that finishes the convolution, im2col's memory cost and the NHWC offset, each
against PyTorch (``F.conv2d``, ``F.unfold``, ``channels_last`` strides) on fresh random data. A wrong answer is
quoted for the first case it fails and compared with what each usual mistake computes: padding left out or
counted once, the + 1 forgotten, rounding up, rows or columns of the matrix in the wrong order, a slice not
transposed, the GEMM's result reshaped without swapping its axes, R S for the blow-up, the NCHW offset for NHWC.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from gpulab.labs.grading import NOT_ANSWERED, Grader, Mistake, attempt, number_problem, shown, tensor_problem

TOLERANCE = 1e-10  # relative error allowed of a float64 result


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fresh(generator: torch.Generator, *shape: int) -> torch.Tensor:
    """Standard-normal float64 data (never zeros: zeros would hide a wrong index)."""
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


def _misfit(error: Exception) -> str:
    """A tensor of the wrong shape, named: a slice written into a slot of another shape (left N x C x P x Q,
    say), a product of mismatched matrices, a reshape to a shape of another size."""
    text = str(error)
    if not isinstance(error, RuntimeError):
        return ""
    if "must match the existing size" in text or "expanded size" in text or "shape mismatch" in text:
        return ("a slice did not fit the slot it was written to: x[:, :, a:b, c:d] is N x C x P x Q, and a slot "
                "columns[:, r, s] of the C x R x S x N x P x Q tensor is C x N x P x Q (.transpose(0, 1)); print "
                "the shapes")
    if "cannot be multiplied" in text:
        shapes = text[text.find("(") + 1:text.find(")")]
        return (f"a product of mismatched matrices ({shapes}): weight.reshape(K, C*R*S) is K x (C R S) and the "
                "im2col matrix (C R S) x (N P Q)")
    if "is invalid for input of size" in text:
        return ("a reshape to a shape of another size: the sizes must multiply to the tensor's number of "
                "elements; check P and Q (your output_size) and the order of the sizes")
    return ""


def _matching(mistakes: Sequence[tuple[str, Callable]], cases: Sequence[tuple], got: Sequence[object],
              equal: Callable[[object, object], bool]) -> str:
    """The hint of the first mistake that computes what the student's code gave on every case."""
    for hint, wrong in mistakes:
        try:
            if all(equal(value, wrong(*case)) for case, value in zip(cases, got, strict=True)):
                return hint
        except (ZeroDivisionError, ValueError):
            continue
    return ""


def formula_problem(fn: Callable, cases: Sequence[tuple], expected: Sequence[object], call: str, source: str,
                    mistakes: Sequence[tuple[str, Callable]] = (), whole: bool = False,
                    equal: Callable[[object, object], bool] = operator.eq) -> str:
    """'' if ``fn(*case)`` equals ``expected`` on every case; otherwise the first case it fails, quoted as
    ``call.format(*case)``, what ``source`` (PyTorch) gives, and the first of ``mistakes`` ((hint, the formula
    it computes)) that matches the student's code on every case. ``whole``: the answer must be an int;
    ``equal``: when two numbers count as equal."""
    got = []
    for case in cases:
        value, problem = attempt(lambda case=case: fn(*case))
        if problem:
            return problem
        got.append(value)
    for case, value, right in zip(cases, got, expected, strict=True):
        if value is None:
            return NOT_ANSWERED
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{call.format(*case)} returned {shown(value)}, not a number"
        if not equal(value, right):
            said = f"{call.format(*case)} returned {shown(value)}, {source} {shown(right)}"
            if whole and isinstance(value, float) and not value.is_integer():
                return f"{said}: a window fits or it does not, so round down with // (floor division)"
            hint = _matching(mistakes, cases, got, equal)
            return f"{said}: {hint}" if hint else said
        if whole and not isinstance(value, int):
            return (f"{call.format(*case)} returned {value!r}, a {type(value).__name__}: sizes are whole "
                    "numbers that size tensors and ranges; use // (floor division)")
    return ""


# --- exercise 1: the output size --------------------------------------------------------------------------------

OUTPUT_SIZE_HINT = ("the padded axis has size + 2 * padding positions; the filter's first start is 0, its last start "
                    "must leave room for all kernel taps, and starts go in steps of stride (// rounds down); count "
                    "them")
OUTPUT_SIZE_MISTAKES = (
    ("the padding is missing: the padded axis has size + 2 * padding positions",
     lambda n, k, s, p: (n - k) // s + 1),
    ("the padding goes on both sides: size + 2 * padding, not size + padding", lambda n, k, s, p: (n + p - k) // s + 1),
    ("the + 1 is missing: the starts 0, stride, 2 stride, ... are one more than the steps between them",
     lambda n, k, s, p: (n + 2 * p - k) // s),
    ("the last window must fit: subtract the kernel size", lambda n, k, s, p: (n + 2 * p) // s + 1),
    ("a window that runs off the end does not count: round down (//), not up",
     lambda n, k, s, p: math.ceil((n + 2 * p - k) / s) + 1),
    ("the + 1 comes after the division: (size + 2 * padding - kernel) // stride + 1",
     lambda n, k, s, p: (n + 2 * p - k + 1) // s),
    ("// binds tighter than + and -: put the numerator in parentheses, (size + 2 * padding - kernel) // stride",
     lambda n, k, s, p: n + 2 * p - k // s + 1),
)


def output_size_cases(count: int = 20, seed: int = 4) -> list[tuple[int, int, int, int]]:
    """``count`` random (size, kernel, stride, padding) along one axis."""
    generator = seeded(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (), generator=generator))

    return [(draw(5, 30), draw(1, 6), draw(1, 4), draw(0, 3)) for _ in range(count)]


def check_output_size(grader: Grader, output_size: Callable) -> None:
    """Exercise 1: ``output_size(size, kernel, stride, padding)`` against the shape of ``F.conv2d``'s output."""
    cases = output_size_cases()
    expected = [F.conv2d(torch.ones(1, 1, n, 1), torch.ones(1, 1, k, 1), stride=s, padding=(p, 0)).shape[2]
                for n, k, s, p in cases]
    problem = formula_problem(output_size, cases, expected, "output_size({}, {}, {}, {})", "conv2d gives",
                              OUTPUT_SIZE_MISTAKES, whole=True)
    grader.record("output_size against conv2d's output shape", problem, OUTPUT_SIZE_HINT)


# --- exercises 2 and 3: im2col --------------------------------------------------------------------------------------

def unfold_as_columns(x: torch.Tensor, r: int, s: int, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """PyTorch's own im2col, rearranged to the lab's (C R S) x (N P Q) matrix.

    ``F.unfold`` returns N x (C R S) x (P Q): one (C R S) x (P Q) matrix per image. Putting the images
    side by side, column block n for image n, gives the lab's matrix.
    """
    columns = F.unfold(x, (r, s), stride=stride, padding=padding)  # N x CRS x PQ
    return columns.transpose(0, 1).reshape(columns.shape[1], -1)  # CRS x (N P Q)


def im2col_mistakes(x: torch.Tensor, r: int, s: int, stride: int = 1, padding: int = 0
                    ) -> tuple[dict[str, torch.Tensor], dict[tuple[int, ...], str]]:
    """({hint: the matrix a mistake builds}, {wrong shape: hint}) for im2col of ``x``."""
    n, c, h, w = x.shape
    right = unfold_as_columns(x, r, s, stride, padding)
    p, q = (h + 2 * padding - r) // stride + 1, (w + 2 * padding - s) // stride + 1
    taps = right.reshape(c, r, s, n, p, q)
    flat = (c * r * s, n * p * q)
    mistakes = {
        "the rows are in the order (r, s, c): c must vary slowest, row = (c R + r) S + s":
            taps.permute(1, 2, 0, 3, 4, 5).reshape(flat),
        "the rows are in the order (c, s, r): s must vary fastest, row = (c R + r) S + s":
            taps.permute(0, 2, 1, 3, 4, 5).reshape(flat),
        "the columns are in the order (p, q, n): the images must lie side by side, column = (n P + p) Q + q":
            taps.permute(0, 1, 2, 4, 5, 3).reshape(flat),
        "the columns are in the order (n, q, p): q must vary fastest, column = (n P + p) Q + q":
            taps.permute(0, 1, 2, 3, 5, 4).reshape(flat),
    }
    shapes = {(n, c * r * s, p * q): "that is F.unfold's N x (C R S) x (P Q): put the images side by side, "
                                     "(C R S) x (N P Q)",
              (c, r, s, n, p, q): "reshape the C x R x S x N x P x Q tensor to (C R S) x (N P Q)"}
    if padding:
        unpadded = unfold_as_columns(x, r, s, stride, 0)
        shapes[tuple(unpadded.shape)] = "that is the matrix without padding: pad x first (F.pad)"
    if stride > 1:
        dense = unfold_as_columns(x, r, s, 1, padding)
        shapes[tuple(dense.shape)] = "that is the stride-1 matrix: take every stride-th window (a slice a:b:stride)"
    return mistakes, shapes


def _layer(x: torch.Tensor, r: int, s: int, stride: int = 1, padding: int = 0) -> str:
    return (f"for x of shape {tuple(x.shape)}, a {r} x {s} filter"
            + (f", stride {stride} and padding {padding}" if stride != 1 or padding else ""))


def im2col_problem(im2col: Callable, cases: Sequence[tuple]) -> str:
    """'' if ``im2col(x, r, s, ...)`` equals PyTorch's on every case; otherwise the first case it fails."""
    for case in cases:
        got, problem = attempt(lambda case=case: im2col(case[0].clone(), *case[1:]), _misfit)
        if problem:
            return problem
        problem = tensor_problem(got, unfold_as_columns(*case), TOLERANCE, *im2col_mistakes(*case))
        if problem:
            return problem if problem == NOT_ANSWERED else f"{_layer(*case)}: {problem}"
    return ""


IM2COL_SIMPLE_HINT = ("row (c, r, s) and column (n, p, q) hold x[n, c, p + r, q + s]; build a C x R x S x N x P x Q "
                      "tensor from the R*S slices x[:, :, r:r+P, s:s+Q] (transposed to C x N x P x Q) and reshape it "
                      "to (C*R*S) x (N*P*Q)")
IM2COL_HINT = ("pad first, then for each tap (r, s) take padded[:, :, r : r + stride*(P-1) + 1 : stride, "
               "s : s + stride*(Q-1) + 1 : stride]; with stride 1 and padding 0 it must give exercise 2's matrix")


def check_im2col_simple(grader: Grader, im2col_simple: Callable, seed: int = 2) -> None:
    """Exercise 2: ``im2col_simple(x, r, s)`` (stride 1, no padding) against ``F.unfold``."""
    generator = seeded(seed)
    cases = [(fresh(generator, 2, 3, 6, 5), 3, 3), (fresh(generator, 1, 1, 4, 4), 2, 2),
             (fresh(generator, 3, 4, 7, 9), 3, 2), (fresh(generator, 2, 5, 6, 6), 1, 1)]
    grader.record("im2col_simple against F.unfold", im2col_problem(im2col_simple, cases), IM2COL_SIMPLE_HINT)


def check_im2col(grader: Grader, im2col: Callable, seed: int = 3) -> None:
    """Exercise 3: ``im2col(x, r, s, stride, padding)`` against ``F.unfold``."""
    generator = seeded(seed)
    cases = [(fresh(generator, 2, 3, 7, 7), 3, 3, 2, 0), (fresh(generator, 1, 4, 9, 6), 3, 2, 2, 1),
             (fresh(generator, 2, 2, 8, 8), 5, 5, 1, 2), (fresh(generator, 3, 3, 11, 10), 3, 3, 3, 2),
             (fresh(generator, 1, 2, 5, 5), 3, 3, 1, 0)]
    grader.record("im2col with stride and padding against F.unfold", im2col_problem(im2col, cases), IM2COL_HINT)


# --- exercise 4: the GEMM that finishes the convolution -------------------------------------------------------------

CONV_HINT = ("weight.reshape(K, C*R*S) @ im2col(...) is K x (N*P*Q): reshape it to (K, N, P, Q) and swap the first "
             "two axes with .transpose(0, 1)")


def conv_mistakes(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int
                  ) -> tuple[dict[str, torch.Tensor], dict[tuple[int, ...], str]]:
    """({hint: the result a mistake computes}, {wrong shape: hint}) for the convolution of ``x`` by ``weight``."""
    n, k, (r, s) = x.shape[0], weight.shape[0], weight.shape[2:]
    columns = unfold_as_columns(x, r, s, stride, padding)
    p, q = (x.shape[2] + 2 * padding - r) // stride + 1, (x.shape[3] + 2 * padding - s) // stride + 1
    y = weight.reshape(k, -1) @ columns
    mistakes = {
        "the K x (N P Q) result was reshaped straight to (N, K, P, Q): its rows are the K filters, so reshape it "
        "to (K, N, P, Q), then swap the first two axes (.transpose(0, 1))": y.reshape(n, k, p, q),
        "weight.reshape(K, C*R*S) puts one filter in each row; reshape(C*R*S, K).T mixes the filters":
            (weight.reshape(-1, k).T @ columns).reshape(k, n, p, q).transpose(0, 1),
    }
    shapes = {(k, n * p * q): "that is the GEMM's K x (N P Q) result: reshape it to (K, N, P, Q), then "
                              ".transpose(0, 1)",
              (k, n, p, q): "that is K x N x P x Q: swap the first two axes (.transpose(0, 1))",
              (n * p * q, k): "that is (N P Q) x K: the GEMM is weight.reshape(K, C*R*S) @ im2col(...)"}
    return mistakes, shapes


def check_conv2d_gemm(grader: Grader, conv2d_gemm: Callable, im2col: Callable | None = None, seed: int = 5) -> None:
    """Exercise 4: ``conv2d_gemm(x, weight, stride, padding)`` against ``F.conv2d`` (if ``im2col``, the student's
    exercise 3, is given and wrong, the message says to fix it first)."""
    generator = seeded(seed)
    layers = [(fresh(generator, 2, 3, 7, 7), fresh(generator, 4, 3, 3, 3), 2, 0),
              (fresh(generator, 1, 4, 9, 6), fresh(generator, 5, 4, 3, 2), 2, 1),
              (fresh(generator, 3, 8, 12, 10), fresh(generator, 6, 8, 3, 3), 1, 1),
              (fresh(generator, 2, 16, 5, 5), fresh(generator, 7, 16, 1, 1), 1, 0)]
    problem = ""
    for x, weight, stride, padding in layers:
        got, problem = attempt(lambda x=x, w=weight, u=stride, p=padding: conv2d_gemm(x.clone(), w.clone(), u, p),
                               _misfit)
        problem = problem or tensor_problem(got, F.conv2d(x, weight, stride=stride, padding=padding), TOLERANCE,
                                            *conv_mistakes(x, weight, stride, padding))
        if problem:
            if problem != NOT_ANSWERED:
                problem = (f"for x of shape {tuple(x.shape)}, weight {tuple(weight.shape)}, stride {stride} and "
                           f"padding {padding}: {problem}")
                if im2col is not None and im2col_problem(im2col, [(x, *weight.shape[2:], stride, padding)]):
                    problem += "; your im2col of exercise 3 does not pass yet: fix it first"
            break
    grader.record("conv2d_gemm against F.conv2d", problem, CONV_HINT)


# --- exercise 5: what im2col costs in memory --------------------------------------------------------------------

BLOWUP_SHAPES = ((56, 56, 3, 3, 1, 1), (224, 224, 7, 7, 2, 3), (28, 28, 1, 1, 1, 0), (13, 17, 5, 3, 2, 0))
BLOWUP_HINT = "elements of the im2col matrix: (C*R*S) * (N*P*Q); of the input: N*C*H*W; divide, and N and C cancel"


def _outputs(h: int, w: int, r: int, s: int, stride: int, padding: int) -> int:
    return ((h + 2 * padding - r) // stride + 1) * ((w + 2 * padding - s) // stride + 1)


BLOWUP_MISTAKES = (
    ("R S is the factor only where P Q = H W (stride 1, 'same' padding); in general it is R S P Q / (H W)",
     lambda h, w, r, s, stride, padding: r * s),
    ("each output position's column holds R S values: multiply P Q / (H W) by R S",
     lambda h, w, r, s, stride, padding: _outputs(h, w, r, s, stride, padding) / (h * w)),
    ("that is the input over the im2col matrix: divide the matrix's size by the input's",
     lambda h, w, r, s, stride, padding: h * w / (r * s * _outputs(h, w, r, s, stride, padding))),
    ("divide by the input's own H W, not by its padded size",
     lambda h, w, r, s, stride, padding: r * s * _outputs(h, w, r, s, stride, padding)
     / ((h + 2 * padding) * (w + 2 * padding))),
)


def _close(a: object, b: object) -> bool:
    """Equal within 1e-9 (a ratio of sizes, computed two ways)."""
    return isinstance(a, int | float) and not isinstance(a, bool) and abs(a - b) < 1e-9


def check_blowup_factor(grader: Grader, blowup_factor: Callable) -> None:
    """Exercise 5: ``blowup_factor(h, w, r, s, stride, padding)`` against the sizes of ``F.unfold``'s tensors."""
    generator = seeded(6)
    measured = []
    for h, w, r, s, stride, padding in BLOWUP_SHAPES:
        x = fresh(generator, 2, 3, h, w)
        measured.append(F.unfold(x, (r, s), stride=stride, padding=padding).numel() / x.numel())
    problem = formula_problem(blowup_factor, BLOWUP_SHAPES, measured, "blowup_factor({}, {}, {}, {}, {}, {})",
                              "the tensors give", BLOWUP_MISTAKES, equal=_close)
    grader.record("blowup_factor against the sizes of real tensors", problem, BLOWUP_HINT)


def check_same_padding(grader: Grader, factor: object) -> None:
    """Exercise 5, by hand: the blow-up of a 3 x 3 filter with stride 1 and 'same' padding is R S = 9."""
    mistakes = [Mistake("a 3 x 3 filter has R S = 9 taps, not R = 3", value=3),
                Mistake("the output is as large as the input, but every input pixel is copied into one column per "
                        "tap that lands on it: R S of them", value=1),
                Mistake("that is R S squared: the factor is R S P Q / (H W), and P Q = H W here", value=81)]
    grader.record("the blow-up of a 3x3 filter with 'same' padding", number_problem(factor, 9, 1e-9, mistakes),
           "with stride 1 and padding 1, P = H and Q = W, so the factor R S P Q / (H W) is R S")


# --- exercise 6: where an element lives in NHWC -----------------------------------------------------------------------

NHWC_HINT = ("in NHWC, c moves fastest, then w, then h, then n: write it like nchw_offset, nesting the indices in "
             "the order n, h, w, c")
NHWC_MISTAKES = (
    ("that is NCHW's order: in NHWC the channel moves fastest",
     lambda n, c, h, w, C, H, W: ((n * C + c) * H + h) * W + w),
    ("h and w are swapped: w moves faster than h (a row holds W pixels)",
     lambda n, c, h, w, C, H, W: ((n * W + w) * H + h) * C + c),
    ("the image index n is missing: each image holds H W C elements",
     lambda n, c, h, w, C, H, W: (h * W + w) * C + c),
    ("the channel is missing: add c", lambda n, c, h, w, C, H, W: ((n * H + h) * W + w) * C),
    ("each pixel holds C channels: multiply the pixel's index by C before adding c",
     lambda n, c, h, w, C, H, W: (n * H + h) * W + w + c),
)


def _nhwc_cases(shape: tuple[int, int, int, int]) -> tuple[list[tuple], list[int]]:
    stride = torch.empty(shape).to(memory_format=torch.channels_last).stride()
    N, C, H, W = shape
    cases = [(n, c, h, w, C, H, W) for n in range(N) for c in range(C) for h in range(H) for w in range(W)]
    return cases, [n * stride[0] + c * stride[1] + h * stride[2] + w * stride[3] for n, c, h, w, *_ in cases]


def check_nhwc_offset(grader: Grader, nhwc_offset: Callable) -> None:
    """Exercise 6: ``nhwc_offset`` against ``torch.channels_last`` strides, on every element of the course's
    1 x 64 x 5 x 4 tensor and of a batch of two 3 x 4 x 5 images."""
    problem = ""
    for shape in ((1, 64, 5, 4), (2, 3, 4, 5)):
        cases, expected = _nhwc_cases(shape)
        problem = formula_problem(nhwc_offset, cases, expected, "nhwc_offset({}, {}, {}, {}, {}, {}, {})",
                                  "PyTorch's strides give", NHWC_MISTAKES, whole=True)
        if problem:
            break
    grader.record("nhwc_offset against torch.channels_last strides", problem, NHWC_HINT)


def check_offset_by_hand(grader: Grader, offset: object) -> None:
    """Exercise 6, by hand: the NHWC offset of (0, 10, 2, 3) in a 1 x 64 x 5 x 4 tensor is (2 x 4 + 3) x 64 + 10."""
    mistakes = [Mistake("that is the NCHW offset, ((n C + c) H + h) W + w", value=(10 * 5 + 2) * 4 + 3, rel=0),
                Mistake("that is where the pixel's channels start: add the channel, 10", value=(2 * 4 + 3) * 64,
                        rel=0),
                Mistake("a row holds W = 4 pixels, not H = 5: pixel (2, 3) is pixel 2 x 4 + 3",
                        value=(2 * 5 + 3) * 64 + 10, rel=0),
                Mistake("h is the row and w the column: pixel (h, w) = (2, 3) is pixel h W + w = 11",
                        value=(3 * 5 + 2) * 64 + 10, rel=0),
                Mistake("that is the pixel's index: each pixel holds 64 channels, then add the channel",
                        value=2 * 4 + 3, rel=0)]
    grader.record("the NHWC offset of (0, 10, 2, 3) in a 1 x 64 x 5 x 4 tensor", number_problem(offset, 714, 0,
                                                                                                 mistakes),
           "count the whole pixels before (2, 3) in row-major order (2 rows of 4, plus 3), times 64 channels, "
           "then add the channel")
