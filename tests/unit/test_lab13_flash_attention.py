"""The graders of the lab "Flash attention" name the usual mistakes: each wrong answer below makes one of them.

Exercises 1 and 2 are NumPy. Exercise 3's kernels run in Triton's interpreter here (compiled on a GPU machine), at
the grader's small shapes; each wrong kernel is the lab's answer (``kernel.py``) with one typical mistake edited
into its source, written to a module of its own (Triton reads a kernel's source from its file). The timing needs a
GPU.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import needs_gpu
from gpulab.core import kernel_mode
from gpulab.core.provenance import fingerprint_of
from gpulab.kernels.triton_attention.reference import random_inputs, reference_attention
from gpulab.labs import grading
from gpulab.labs.lab13_flash_attention import diagnose, kernel, measure, online_softmax

# --- exercise 1: the online-softmax update ------------------------------------------------------------


def test_the_reference_update_passes_on_fresh_tiles():
    found = online_softmax.diagnose_online_update(online_softmax.online_update)
    assert found.ok and found.detail.startswith("passed") and len(online_softmax.update_cases(
        np.random.default_rng(0))) == 4


@pytest.mark.parametrize("mistake", list(online_softmax.MISTAKES))
def test_each_typical_mistake_is_named(mistake):
    wrong, hint = online_softmax.MISTAKES[mistake]
    found = online_softmax.diagnose_online_update(wrong, seed=4)
    assert found.problem == mistake and online_softmax.HINTS[mistake] == hint
    assert len(found.returned) == 3 and len(found.expected) == 3 and found.case in found.detail
    assert not all(np.allclose(r, e) for r, e in zip(found.returned, found.expected, strict=True))


def test_the_rescaling_mistakes_show_only_once_the_maximum_moves():
    assert online_softmax.diagnose_online_update(online_softmax.forgot_rescale).case == (
        "a tile that raises every row's maximum")
    assert online_softmax.diagnose_online_update(online_softmax.max_updated_after_use).case.startswith("the first")


def test_other_wrong_answers_get_a_hint_without_a_name():
    def doubled_l(m, l, acc, s, v):  # noqa: E741
        m, l, acc = online_softmax.online_update(m, l, acc, s, v)  # noqa: E741
        return m, 2 * l, acc

    def in_place(m, l, acc, s, v):  # noqa: E741  (updating the inputs in place is fine: the grader passes copies)
        m_new, l_new, acc_new = online_softmax.online_update(m, l, acc, s, v)
        m[:], l[:], acc[:] = m_new, l_new, acc_new
        return m, l, acc

    found = online_softmax.diagnose_online_update(doubled_l)
    assert found.problem == "wrong values" and found.detail.endswith("l differ from the expected values")
    failed = online_softmax.diagnose_online_update(lambda *a: 1 / 0)
    assert failed.problem == "error" and "ZeroDivisionError" in failed.detail
    assert online_softmax.diagnose_online_update(lambda *args: args[:2]).problem == "not three arrays"
    assert online_softmax.diagnose_online_update(in_place).ok


def _not_implemented(*args):
    raise NotImplementedError


@pytest.mark.parametrize("stub", [lambda *args: None, _not_implemented], ids=["None", "NotImplementedError"])
def test_a_stub_is_not_answered_yet(stub):
    for diagnose_fn in (online_softmax.diagnose_online_update, online_softmax.diagnose_tile_loop):
        found = diagnose_fn(stub)
        assert found.problem == "not answered" and found.detail == grading.NOT_ANSWERED


def test_a_tile_loop_over_an_unanswered_update_is_not_answered_yet():
    def loop(q, k, v, block_n):  # the student's loop around exercise 1's stub, which returns None
        return online_softmax.tile_loop(q, k, v, block_n, update=lambda *args: None)

    assert online_softmax.diagnose_tile_loop(loop).problem == "not answered"


# --- exercise 2: the tile loop -----------------------------------------------------------------------

def _undivided(q, k, v, block_n):
    """The tile loop without its last line (acc / l)."""
    m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), v.shape[1]))  # noqa: E741
    for start in range(0, len(k), block_n):
        s = q @ k[start:start + block_n].T / np.sqrt(q.shape[1])
        m, l, acc = online_softmax.online_update(m, l, acc, s, v[start:start + block_n])  # noqa: E741
    return acc


def _dropped(q, k, v, block_n):
    whole = k.shape[0] // block_n * block_n
    return online_softmax.tile_loop(q, k[:whole], v[:whole], block_n)


def test_the_tile_loop_grader():
    assert online_softmax.diagnose_tile_loop(online_softmax.tile_loop).ok
    assert online_softmax.diagnose_tile_loop(_undivided).problem == "not divided by l"
    found = online_softmax.diagnose_tile_loop(_dropped)
    assert found.problem == "dropped the last tile" and found.case.startswith("a short last tile")
    assert online_softmax.diagnose_tile_loop(lambda q, k, v, n: 2 * online_softmax.tile_loop(q, k, v, n)).problem == (
        "wrong values")
    for problem in ("not divided by l", "dropped the last tile", "wrong values", "not answered"):
        assert online_softmax.HINTS[problem]


# --- exercise 3: the update inside the Triton kernel -------------------------------------------------

SOURCE = Path(kernel.__file__).read_text()
BODY = ("    m_new = tl.maximum(m_i, tl.max(s, 1))\n    alpha = tl.exp2(m_i - m_new)\n"
        "    p = tl.exp2(s - m_new[:, None])\n    l_i = l_i * alpha + tl.sum(p, 1)\n    acc = acc * alpha[:, None]\n"
        "    acc = tl.dot(p.to(v.dtype), v, acc)\n    return m_new, l_i, acc\n")
RESCALE_ACC, RESCALE_L = "    acc = acc * alpha[:, None]\n", ("l_i = l_i * alpha + ", "l_i = l_i + ")
DIVIDE = ("out = acc / l_i[:, None]", "out = acc")
IN_LOOP = ("return m_new, l_i, acc", "return m_new, l_i, acc / l_i[:, None]")
# a typical wrong kernel: (the problem the grader must name, edits of kernel.py's source)
WRONG_KERNELS = {
    "tl.dot(p, v)": ("p not cast", [("tl.dot(p.to(v.dtype), v, acc)", "tl.dot(p, v, acc)")]),
    "tl.exp everywhere": ("exp instead of exp2", [("tl.exp2(m_i", "tl.exp(m_i"), ("tl.exp2(s", "tl.exp(s")]),
    "tl.exp for p": ("exp instead of exp2", [("tl.exp2(s", "tl.exp(s")]),
    "tl.exp for alpha": ("exp instead of exp2", [("tl.exp2(m_i", "tl.exp(m_i")]),
    "2^s": ("max not subtracted", [("tl.exp2(s - m_new[:, None])", "tl.exp2(s)")]),
    "acc not rescaled": ("acc not rescaled", [(RESCALE_ACC, "")]),
    "l not rescaled": ("l not rescaled", [RESCALE_L]),
    "neither rescaled": ("neither rescaled", [(RESCALE_ACC, ""), RESCALE_L]),
    "returns the old m": ("m not carried", [("return m_new, l_i, acc", "return m_i, l_i, acc")]),
    "acc / l in the loop": ("divided by l in the loop", [IN_LOOP]),
    "acc / l in the loop only": ("divided by l in the loop", [IN_LOOP, DIVIDE]),
    "no acc / l": ("not divided by l", [DIVIDE]),
    "p against the old m": ("not finite", [("tl.exp2(s - m_new[:, None])", "tl.exp2(s - m_i[:, None])")]),
    "the unsafe softmax": ("overflow", [("tl.exp2(s - m_new[:, None])", "tl.exp2(s)"), RESCALE_L, (RESCALE_ACC, "")]),
    "the stub": ("not answered", [(BODY, "    return m_i, l_i, acc\n"), DIVIDE]),
    "a typo": ("error", [("tl.exp2(s - m_new[:, None])", "tl.exp2(s - m_nw[:, None])")]),
}


@pytest.fixture(scope="module")
def wrong_kernels(tmp_path_factory):
    """Each of WRONG_KERNELS as a kernel, from a module of its own."""
    folder = tmp_path_factory.mktemp("lab13_kernels")
    kernels = {}
    for index, (name, (_, edits)) in enumerate(WRONG_KERNELS.items()):
        source = SOURCE
        for old, new in edits:
            assert old in source, (name, old)
            source = source.replace(old, new)
        path = folder / f"lab13_wrong_{index}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        kernels[name] = module.flash_forward
    yield kernels
    for index in range(len(WRONG_KERNELS)):
        sys.modules.pop(f"lab13_wrong_{index}", None)


def test_the_lab_kernel_passes_every_case():
    found = diagnose.diagnose_kernel(kernel.flash_forward)
    assert found.ok and f"all {len(diagnose.CASES)} cases" in found.detail


@pytest.mark.parametrize("name", list(WRONG_KERNELS))
def test_each_wrong_kernel_gets_its_problem_and_a_hint(name, wrong_kernels):
    problem = WRONG_KERNELS[name][0]
    found = diagnose.diagnose_kernel(wrong_kernels[name])
    assert found.problem == problem, found.detail
    assert diagnose.HINTS[problem]
    if problem == "not answered":
        assert found.detail == grading.NOT_ANSWERED
    if problem == "error":
        assert "NameError" in found.detail and "m_nw" in found.detail


def test_grading_a_kernel_prints_the_hint_and_strict_raises(wrong_kernels, capsys):
    grader = grading.Grader(strict=False)
    assert not diagnose.grade_kernel(grader, "kernel", wrong_kernels["acc not rescaled"])
    printed = capsys.readouterr().out
    assert printed.startswith("NOT YET  kernel") and "hint: acc was summed under the old maximum" in printed
    with pytest.raises(grading.CheckFailed):
        diagnose.grade_kernel(grading.Grader(strict=True), "kernel", wrong_kernels["no acc / l"])
    assert diagnose.grade_kernel(grading.Grader(strict=True), "kernel", kernel.flash_forward)
    assert not diagnose.grade_kernel(grader, "not a kernel", lambda *args: None)  # reported, not raised


def test_the_simulation_of_the_right_kernel_is_attention():
    q, k, v, _ = random_inputs((1, 2, 40, 16), torch.float64, torch.device("cpu"), seed=3)
    expected, _ = reference_attention(q, k, v)
    arrays = [t.numpy() for t in (q, k, v)]
    for block_n in (16, 64):
        assert np.allclose(diagnose.simulate(*arrays, block_n), expected.numpy(), rtol=1e-10, atol=1e-12)


def test_attend_checks_its_arguments():
    q, k, v, _ = random_inputs((1, 2, 32, 16), torch.float32, torch.device("cpu"))
    with pytest.raises(TypeError, match="^kernel: a @triton.jit function"):
        kernel.attend(lambda *args: None, q, k, v)
    with pytest.raises(ValueError, match="^q: head_dim"):
        kernel.attend(kernel.flash_forward, q[..., :12], k[..., :12], v[..., :12])
    with pytest.raises(ValueError, match="unknown"):
        kernel.attend(kernel.flash_forward, q, k, v, BLOCK_K=16)
    with pytest.raises(ValueError, match="BLOCK_N must be a power of two"):
        kernel.attend(kernel.flash_forward, q, k, v, BLOCK_N=24)
    out = kernel.attend(kernel.flash_forward, q, k, v, BLOCK_M=16, BLOCK_N=16)
    assert out.shape == q.shape and out.dtype == q.dtype


# --- exercise 4 and the race: what runs without a GPU ------------------------------------------------

def test_the_shape_and_the_work():
    assert measure.attention_shape(4096, 128) == (4, 16, 4096, 128)
    assert measure.attention_shape(32768, 64) == (1, 32, 32768, 64)
    with pytest.raises(ValueError, match="^head_dim"):
        measure.attention_shape(4096, 96)
    with pytest.raises(ValueError, match="^seq_len"):
        measure.attention_shape(0, 128)


def test_the_tables_of_recorded_rows():
    recorded = [{"implementation": name, "seq_len": 4096, "head_dim": 128, "causal": False, "status": "ok",
                 "forward_seconds": seconds, "forward_tflops": 137 / seconds / 1e3}
                for name, seconds in (("triton", 1.2e-3), ("sdpa-cudnn", 0.9e-3), ("sdpa-flash", 1.6e-3))]
    recorded += [{"implementation": "sdpa-math", "seq_len": 4096, "head_dim": 128, "causal": False,
                  "status": "out of memory"},
                 {"implementation": "triton", "seq_len": 4096, "head_dim": 128, "causal": True, "status": "ok",
                  "forward_seconds": 1.0, "forward_tflops": 1.0}]
    rows = measure.book_kernel_rows(recorded)
    assert [r["implementation"] for r in rows] == ["book", "sdpa-cudnn", "sdpa-flash", "sdpa-math"]
    assert rows[0]["vs_best_sdpa"] == pytest.approx(0.75) and rows[1]["vs_best_sdpa"] == pytest.approx(1.0)
    assert "vs_best_sdpa" not in rows[3]
    text = str(measure.gpu_table([("H100", rows)]))
    assert text.index("SDPA, cuDNN backend") < text.index("the book's kernel") < text.index("math")
    assert "75%" in text and "out of memory" in text
    assert str(measure.comparison_table(rows)).count("\n") == len(rows) + 1  # a header, a rule, a line per row


def test_the_race_needs_a_gpu_and_its_recording_fingerprints_the_kernels():
    if not kernel_mode.on_gpu():
        with pytest.raises(ValueError, match="^compare_with_sdpa: times kernels"):
            measure.lab_kernel_against_sdpa()
    parts = fingerprint_of(measure.lab_kernel_against_sdpa).parts
    assert {"gpulab.labs.lab13_flash_attention.kernel.flash_forward",
            "gpulab.labs.lab13_flash_attention.kernel.tile_update",
            "gpulab.kernels.triton_attention.forward.forward_kernel"} <= set(parts)


# --- on a GPU ----------------------------------------------------------------------------------------

@needs_gpu
def test_on_the_gpu_the_grader_compiles_the_kernels(wrong_kernels):
    assert diagnose.diagnose_kernel(kernel.flash_forward).ok
    assert diagnose.diagnose_kernel(wrong_kernels["tl.dot(p, v)"]).problem == "p not cast"
    assert diagnose.diagnose_kernel(wrong_kernels["acc not rescaled"]).problem == "acc not rescaled"


@needs_gpu
def test_the_race_on_the_gpu():
    rows = measure.compare_with_sdpa({"lab": lambda q, k, v: kernel.attend(kernel.flash_forward, q, k, v)},
                                     seq_len=1024, head_dim=64, rounds=2)
    by_name = {r["implementation"]: r for r in rows}
    assert set(by_name) == {"lab", *measure.SDPA_BACKENDS} and by_name["lab"]["status"] == "ok"
    assert by_name["lab"]["tflops"] > 0 and by_name["lab"]["vs_best_sdpa"] > 0
    assert any(r["status"] == "ok" and r.get("vs_best_sdpa") == 1.0 for r in rows)  # the fastest backend itself
