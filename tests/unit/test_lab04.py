"""Lab 04's graders (``gpulab.labs.lab04_im2col_convolution``): the output size, im2col, the convolution's GEMM,
the blow-up and the NHWC offset against PyTorch, with the usual mistakes named."""

from __future__ import annotations

import contextlib
import io
import math

import pytest
import torch.nn.functional as F

from gpulab.labs import grading
from gpulab.labs import lab04_im2col_convolution as lab04
from gpulab.labs.grading import NOT_ANSWERED, tensor_problem


def graded(check, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(grading.Grader(strict=False), *args)
    return " ".join(out.getvalue().split())  # the lines are wrapped at 90 characters: compare the words


def output_size(size, kernel, stride=1, padding=0):
    return (size + 2 * padding - kernel) // stride + 1


@pytest.mark.parametrize(("formula", "said"), [
    (output_size, "PASS output_size"),
    (lambda n, k, s=1, p=0: (n - k) // s + 1, "the padding is missing"),
    (lambda n, k, s=1, p=0: (n + p - k) // s + 1, "the padding goes on both sides"),
    (lambda n, k, s=1, p=0: (n + 2 * p - k) // s, "the + 1 is missing"),
    (lambda n, k, s=1, p=0: (n + 2 * p) // s + 1, "subtract the kernel size"),
    (lambda n, k, s=1, p=0: math.ceil((n + 2 * p - k) / s) + 1, "round down (//), not up"),
    (lambda n, k, s=1, p=0: n + 2 * p - k // s + 1, "// binds tighter than + and -"),
    (lambda n, k, s=1, p=0: (n + 2 * p - k) / s + 1, "a window fits or it does not"),
    (lambda n, k, s=1, p=0: float(output_size(n, k, s, p)), "a float: sizes are whole numbers"),
    (lambda n, k, s=1, p=0: None, NOT_ANSWERED),
])
def test_the_output_size(formula, said):
    out = graded(lab04.check_output_size, formula)
    assert said in out
    if "PASS" not in said and said != NOT_ANSWERED:
        assert "conv2d gives" in out or "a float" in out  # the case it fails is quoted


def im2col(x, r, s, stride=1, padding=0, transpose=True, rows="crs"):
    N, C, H, W = x.shape
    P, Q = output_size(H, r, stride, padding), output_size(W, s, stride, padding)
    padded = F.pad(x, (padding, padding, padding, padding))
    columns = x.new_empty((C, r, s, N, P, Q))
    for i in range(r):
        for j in range(s):
            taps = padded[:, :, i:i + stride * (P - 1) + 1:stride, j:j + stride * (Q - 1) + 1:stride]
            columns[:, i, j] = taps.transpose(0, 1) if transpose else taps
    if rows == "rsc":
        columns = columns.permute(1, 2, 0, 3, 4, 5)
    return columns.reshape(C * r * s, N * P * Q)


@pytest.mark.parametrize(("fn", "said"), [
    (lambda x, r, s: im2col(x, r, s), "PASS im2col_simple"),
    (lambda x, r, s: im2col(x, r, s, transpose=False), "a slice did not fit the slot it was written to"),
    (lambda x, r, s: im2col(x, r, s, rows="rsc"), "the rows are in the order (r, s, c)"),
    (lambda x, r, s: F.unfold(x, (r, s)), "that is F.unfold's N x (C R S) x (P Q)"),
    (lambda x, r, s: im2col(x, r, s).T, "transposed?"),
    (lambda x, r, s: 2 * im2col(x, r, s), "the values are wrong: a relative error of"),
    (lambda x, r, s: None, NOT_ANSWERED),
])
def test_im2col_simple(fn, said):
    assert said in graded(lab04.check_im2col_simple, fn)


def test_the_matrixs_usual_wrong_orders_are_named():
    x = lab04.fresh(lab04.seeded(0), 2, 3, 6, 5)
    mistakes, _ = lab04.im2col_mistakes(x, 3, 2)
    for hint, wrong in mistakes.items():
        assert tensor_problem(wrong, lab04.unfold_as_columns(x, 3, 2), lab04.TOLERANCE, mistakes) == (
            f"the values are wrong: {hint}")


@pytest.mark.parametrize(("fn", "said"), [
    (im2col, "PASS im2col with stride and padding"),
    (lambda x, r, s, stride=1, padding=0: im2col(x, r, s, stride, 0), "that is the matrix without padding"),
    (lambda x, r, s, stride=1, padding=0: im2col(x, r, s, 1, padding), "that is the stride-1 matrix"),
    (lambda x, r, s, stride=1, padding=0: None, NOT_ANSWERED),
])
def test_im2col_with_stride_and_padding(fn, said):
    out = graded(lab04.check_im2col, fn)
    assert said in out
    if "PASS" not in said and said != NOT_ANSWERED:
        assert "for x of shape" in out and "stride" in out  # the failing case is quoted


def conv(x, weight, stride=1, padding=0, swap=True, flatten="K"):
    N, C, H, W = x.shape
    K, _, R, S = weight.shape
    P, Q = output_size(H, R, stride, padding), output_size(W, S, stride, padding)
    rows = weight.reshape(K, C * R * S) if flatten == "K" else weight.reshape(C * R * S, K).T
    y = rows @ im2col(x, R, S, stride, padding)
    return y.reshape(K, N, P, Q).transpose(0, 1) if swap else y.reshape(N, K, P, Q)


@pytest.mark.parametrize(("fn", "said"), [
    (conv, "PASS conv2d_gemm"),
    (lambda x, w, u=1, p=0: conv(x, w, u, p, swap=False), "was reshaped straight to (N, K, P, Q)"),
    (lambda x, w, u=1, p=0: conv(x, w, u, p, flatten="CRS"), "reshape(C*R*S, K).T mixes the filters"),
    (lambda x, w, u=1, p=0: conv(x, w, u, p).transpose(0, 1), "that is K x N x P x Q"),
    (lambda x, w, u=1, p=0: w.reshape(w.shape[0], -1) @ im2col(x, *w.shape[2:], u, p),
     "that is the GEMM's K x (N P Q) result"),
    (lambda x, w, u=1, p=0: None, NOT_ANSWERED),
])
def test_conv2d_gemm(fn, said):
    assert said in graded(lab04.check_conv2d_gemm, fn, im2col)


def test_a_wrong_im2col_is_named_first():
    no_stride = lambda x, r, s, stride=1, padding=0: im2col(x, r, s, 1, padding)  # noqa: E731

    def conv_on_it(x, weight, stride=1, padding=0):
        K, C, R, S = weight.shape
        y = weight.reshape(K, -1) @ no_stride(x, R, S, stride, padding)
        return y.reshape(K, x.shape[0], output_size(x.shape[2], R, stride, padding),
                         output_size(x.shape[3], S, stride, padding)).transpose(0, 1)

    out = graded(lab04.check_conv2d_gemm, conv_on_it, no_stride)
    assert "a reshape to a shape of another size" in out and "your im2col of exercise 3 does not pass yet" in out


def blowup(h, w, r, s, stride=1, padding=0):
    return r * s * output_size(h, r, stride, padding) * output_size(w, s, stride, padding) / (h * w)


@pytest.mark.parametrize(("fn", "said"), [
    (blowup, "PASS blowup_factor"),
    (lambda h, w, r, s, stride=1, padding=0: r * s, "R S is the factor only where P Q = H W"),
    (lambda h, w, r, s, stride=1, padding=0: blowup(h, w, r, s, stride, padding) / (r * s), "multiply"),
    (lambda h, w, r, s, stride=1, padding=0: 1 / blowup(h, w, r, s, stride, padding), "that is the input over"),
    (lambda h, w, r, s, stride=1, padding=0: blowup(h, w, r, s, stride, padding) * h * w
     / ((h + 2 * padding) * (w + 2 * padding)), "not by its padded size"),
    (lambda h, w, r, s, stride=1, padding=0: None, NOT_ANSWERED),
])
def test_the_blowup_factor(fn, said):
    assert said in graded(lab04.check_blowup_factor, fn)


@pytest.mark.parametrize(("value", "said"), [(9, "PASS"), (3, "not R = 3"), (1, "one column per tap"),
                                             (81, "R S squared"), ("9", "not a number"), (None, NOT_ANSWERED)])
def test_the_blowup_of_same_padding(value, said):
    assert said in graded(lab04.check_same_padding, value)


@pytest.mark.parametrize(("fn", "said"), [
    (lambda n, c, h, w, C, H, W: ((n * H + h) * W + w) * C + c, "PASS nhwc_offset"),
    (lambda n, c, h, w, C, H, W: ((n * C + c) * H + h) * W + w, "that is NCHW's order"),
    (lambda n, c, h, w, C, H, W: ((n * W + w) * H + h) * C + c, "h and w are swapped"),
    (lambda n, c, h, w, C, H, W: (h * W + w) * C + c, "the image index n is missing"),
    (lambda n, c, h, w, C, H, W: ((n * H + h) * W + w) * C, "the channel is missing"),
    (lambda n, c, h, w, C, H, W: (n * H + h) * W + w + c, "multiply the pixel's index by C"),
    (lambda n, c, h, w, C, H, W: None, NOT_ANSWERED),
])
def test_the_nhwc_offset(fn, said):
    assert said in graded(lab04.check_nhwc_offset, fn)


@pytest.mark.parametrize(("value", "said"), [(714, "PASS"), (211, "that is the NCHW offset"),
                                             (704, "add the channel"), (842, "a row holds W = 4 pixels"),
                                             (1098, "h is the row and w the column"),
                                             (11, "that is the pixel's index"), (None, NOT_ANSWERED)])
def test_the_offset_by_hand(value, said):
    assert said in graded(lab04.check_offset_by_hand, value)
