import pytest
from helpers import at, lint_fixture, lint_text, prove_text

pytestmark = pytest.mark.no_fork


def test_fixture():
    assert lint_fixture("PC005_nondeterministic_render.jinja")[0] == [("PC005", 2, 42)]


@pytest.mark.parametrize(
    ("source", "anchors"),
    [
        ("{{ lipsum(1) }}", ["lipsum"]),
        # lipsum called through a name, or out of a namespace, that holds it
        ("{% set words = lipsum %}{{ words(1) }}", ["words("]),
        ("{% set ns = namespace(words=lipsum) %}{{ ns.words(1) }}", ["ns.words"]),
        ("{{ ['a', 'b'] | shuffle | join(',') }}", ["shuffle"]),
        # the template's own `lipsum` draws nothing
        ("{% macro lipsum(n) %}text{% endmacro %}{{ lipsum(1) }}", []),
        ("{% set pick = ['a', 'b'] | random %}{% if pick == 'a' %}A{% endif %}", ["random"]),
        # chosen but never used: noop
        ("{% set pick = ['a', 'b'] | random %}{{ messages[0].content }}", []),
    ],
)
def test_cases(source, anchors):
    assert lint_text(source)[0] == [at("PC005", source, anchor) for anchor in anchors]


def test_a_pick_made_only_when_tools_are_given_is_proven_random_and_named_so():
    # The "Hi" chat the determinism check once rendered draws nothing here: the agent's
    # request that drew is the one rendered twenty times. Before, the pick's divergences
    # were PC100 and PC006 while PC005 was "not reproduced".
    source = (
        "{% if tools %}{{ ['Be brief.', 'Be kind.'] | random }}{% endif %}"
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    codes, (finding,) = prove_text(source)
    assert codes == [at("PC005", source, "random")]
    assert (finding.proof.status, finding.proof.evidence) == ("proven", "twenty renders of one request")
