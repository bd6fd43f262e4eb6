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
