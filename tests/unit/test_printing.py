import pytest

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.core import printing


@pytest.mark.parametrize(("nbytes", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (3 * 2**19, "1.5 MiB"),
    (2**30, "1.0 GiB"), (5 * 2**40, "5,120.0 GiB"),
])
def test_format_bytes_picks_the_largest_unit_at_least_one(nbytes, text):
    assert printing.format_bytes(nbytes) == text


def test_format_bytes_refuses_a_negative_count():
    with pytest.raises(ValueError, match="nbytes"):
        printing.format_bytes(-1)


def test_show_source_displays_the_functions_own_code(capsys):
    printing.show_source(conv.output_size)
    shown = capsys.readouterr().out
    assert "def output_size(" in shown


def test_an_answer_is_closed_until_opened_and_keeps_its_markdown():
    shown = printing.Answer("Answer to exercise 2", ("The peak is **19.5** TFLOP/s: `sms * 64 * 2 * clock`.",
                                                     "- first <step>", "- second", "Then *compare*."))
    page = shown._repr_html_()
    assert page.startswith('<details class="gpulab-answer"><summary>Answer to exercise 2</summary>')
    assert "<strong>19.5</strong>" in page and "<code>sms * 64 * 2 * clock</code>" in page
    assert "<ul><li>first &lt;step&gt;</li><li>second</li></ul><p>Then <em>compare</em>.</p>" in page
    assert repr(shown).splitlines()[0] == "Answer to exercise 2"
    with pytest.raises(ValueError, match="no lines"):
        printing.Answer("empty", ())
