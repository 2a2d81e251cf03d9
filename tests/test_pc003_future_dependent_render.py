import pytest
from helpers import at, lint_fixture, lint_text


def test_fixture_last_user_message_blocks():
    codes, findings = lint_fixture("PC003_future_dependent_render.jinja")
    assert codes == [("PC003", 11, 37), ("PC003", 14, 16)]
    assert "`user_messages[-1]`" in findings[0].message
    assert "`loop.last`" in findings[1].message


def test_fixture_look_ahead_scan():
    codes, findings = lint_fixture("PC003_lookahead.jinja")
    assert codes == [("PC003", 4, 27)]
    assert "looks ahead" in findings[0].message


def test_group_closure_is_not_reported():
    assert lint_fixture("clean_group_closure.jinja")[0] == []


@pytest.mark.parametrize(
    ("source", "anchors"),
    [
        # the generation prompt inside the loop: noop
        ("{% for m in messages %}{{ m.content }}{% if loop.last and add_generation_prompt %}<bot>{% endif %}{% endfor %}", []),
        # loop.last in a loop over tools, not messages: noop
        ("{% for t in tools %}{{ t.name }}{% if not loop.last %},{% endif %}{% endfor %}", []),
        # the next message alone decides: reported
        (
            "{% for m in messages %}{{ m.content }}{% if loop.nextitem and loop.nextitem.role == 'user' %}<eot>{% endif %}{% endfor %}",
            ["loop.nextitem"],
        ),
        # comparing the index with the message count
        (
            "{% for m in messages %}{% if loop.index0 == messages|length - 1 %}[last]{% endif %}{{ m.content }}{% endfor %}",
            ["messages|length"],
        ),
        # a forward range over indices
        (
            "{% for m in messages %}{% for k in range(loop.index0 + 1, messages|length) %}{{ messages[k].role }}{% endfor %}{% endfor %}",
            ["range("],
        ),
    ],
)
def test_cases(source, anchors):
    assert lint_text(source)[0] == [at("PC003", source, anchor) for anchor in anchors]
