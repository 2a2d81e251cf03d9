import pytest
from helpers import at, lint_fixture, lint_text


def test_fixture():
    assert lint_fixture("PC005_nondeterministic_render.jinja")[0] == [("PC005", 2, 42)]


@pytest.mark.parametrize(
    ("source", "anchors"),
    [
        ("{{ lipsum(1) }}", ["lipsum"]),
        ("{% set pick = ['a', 'b'] | random %}{% if pick == 'a' %}A{% endif %}", ["random"]),
        # chosen but never used: noop
        ("{% set pick = ['a', 'b'] | random %}{{ messages[0].content }}", []),
    ],
)
def test_cases(source, anchors):
    assert lint_text(source)[0] == [at("PC005", source, anchor) for anchor in anchors]
