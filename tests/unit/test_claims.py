"""Claims as code (gpulab.core.claims): every chapter's claims hold on every recorded GPU, and the mechanism fails
where a rule fails on one GPU, scopes a sentence, and checks a GPU that is added later."""

from __future__ import annotations

import json

import pytest

from gpulab import course
from gpulab.core import claims, recordings
from gpulab.core.claims import Claim, ClaimFailed, verdict
from gpulab.labs.lab09_pick_the_convolution_algorithm import claims as lab09_claims

# every chapter's claims, and the labs' (a lab's summary states what its recordings show)
CHAPTER_CLAIMS = course.all_claims() + [("lab09", lab09_claims.TF32_BEATS_FLOAT16_AT_60_CHANNELS)]


@pytest.mark.parametrize("chapter, claim", CHAPTER_CLAIMS, ids=[f"{ch[:4]}-{c.name}" for ch, c in CHAPTER_CLAIMS])
def test_every_chapter_claim_holds_where_the_page_says(chapter, claim):
    checks = claims.verify(claim)
    assert checks, f"{chapter}: claim {claim.name!r} has no GPU recording of {claim.experiment} to check"
    printed = claims.sentence(claim, checks)
    assert all(check.gpu in printed for check in checks)


def test_the_claims_are_checked_on_both_recorded_gpus_where_both_recorded_the_experiment():
    for _, claim in CHAPTER_CLAIMS:
        recorded = {r.device_name for r in recordings.newest_per_gpu(claim.experiment) if r.on_gpu}
        assert {c.recording.device_name for c in claims.check(claim)} == recorded


def _record(root, gpu: str, rate: float) -> None:
    folder = root / gpu.lower().replace(" ", "-")
    folder.mkdir(parents=True, exist_ok=True)
    data = {"schema": recordings.SCHEMA, "experiment": "toy", "function": "m:f", "params": {},
            "rows": [{"kernel": "a", "rate": rate}, {"kernel": "b", "rate": 1.0}],
            "provenance": {"device": {"name": gpu, "kind": "cuda"}, "date": "2026-11-25T00:00:00"}}
    (folder / "toy.json").write_text(json.dumps(data))


def _a_beats_b(run):
    a, b = (r["rate"] for r in run.rows)
    return verdict(a > b, f"a {a:g}, b {b:g}")


RULE = Claim("a_beats_b", "Kernel a is faster than kernel b.", "toy", _a_beats_b)
SCOPED = Claim("a_beats_b_scoped", "kernel a is faster than kernel b.", "toy", _a_beats_b, scoped=True)


def test_a_rule_that_holds_on_every_gpu_is_printed_with_each_gpus_numbers(tmp_path):
    _record(tmp_path, "NVIDIA H100", 2.0)
    _record(tmp_path, "NVIDIA H200", 3.0)
    text = claims.sentence(RULE, claims.verify(RULE, tmp_path))
    assert text.startswith("Kernel a is faster than kernel b.")
    assert "H100: a 2, b 1" in text and "H200: a 3, b 1" in text


def test_a_rule_that_fails_on_one_gpu_stops_the_page_naming_the_gpu_and_its_numbers(tmp_path):
    _record(tmp_path, "NVIDIA H100", 0.5)
    _record(tmp_path, "NVIDIA H200", 3.0)
    with pytest.raises(ClaimFailed, match=r"'a_beats_b'.*NVIDIA H100.*a 0.5, b 1.*scope the sentence"):
        claims.verify(RULE, tmp_path)


def test_a_gpu_recorded_later_is_checked_without_an_edit_to_the_claim(tmp_path):
    _record(tmp_path, "NVIDIA H200", 3.0)
    claims.verify(RULE, tmp_path)
    _record(tmp_path, "NVIDIA B200", 0.9)  # a third GPU's recording arrives
    with pytest.raises(ClaimFailed, match="B200"):
        claims.verify(RULE, tmp_path)


def test_a_scoped_claim_names_where_it_holds_and_where_not(tmp_path):
    _record(tmp_path, "NVIDIA H100", 0.5)
    _record(tmp_path, "NVIDIA H200", 3.0)
    text = claims.sentence(SCOPED, claims.verify(SCOPED, tmp_path))
    assert text.startswith("On the H200: kernel a is faster than kernel b. Not on the H100.")


def test_a_scoped_claim_that_holds_nowhere_fails(tmp_path):
    _record(tmp_path, "NVIDIA H100", 0.5)
    with pytest.raises(ClaimFailed, match="rewrite the sentence"):
        claims.verify(SCOPED, tmp_path)


def test_a_claim_without_recordings_says_so(tmp_path):
    assert "No GPU recording of toy" in claims.sentence(RULE, claims.verify(RULE, tmp_path))


def test_a_test_that_cannot_read_the_recording_is_named(tmp_path):
    _record(tmp_path, "NVIDIA H100", 2.0)
    broken = Claim("broken", "Something.", "toy", lambda run: verdict(run.rows[0]["missing"] > 0, ""))
    with pytest.raises(ClaimFailed, match=r"'broken'.*cannot read.*KeyError"):
        claims.verify(broken, tmp_path)


def test_a_claim_needs_a_sentence_and_a_test():
    with pytest.raises(ValueError, match="empty sentence"):
        Claim("x", " ", "toy", _a_beats_b)
    with pytest.raises(TypeError, match="test must be a function"):
        Claim("x", "Something.", "toy", "not a function")
