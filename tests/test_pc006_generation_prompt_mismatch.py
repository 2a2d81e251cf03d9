from helpers import lint_fixture, lint_text


def test_fixture_with_default_stable_switch():
    codes, findings = lint_fixture("PC006_generation_prompt_mismatch.jinja")
    assert codes == [("PC006", 12, 13)]
    switch = findings[0].switch
    assert switch.name == "enable_thinking"
    assert switch.default_is_stable is True
    assert switch.unstable_value is False
    assert "only when enable_thinking=false" in findings[0].full_message()


def test_history_that_prints_the_opener_every_turn_is_clean():
    source = (
        "{% for m in messages %}{% if m.role == 'assistant' %}<think>{{ m.reasoning_content }}</think>{{ m.content }}"
        "{% else %}{{ m.content }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant><think>{% endif %}"
    )
    assert lint_text(source)[0] == []


def test_generation_prompt_without_opener_is_clean():
    assert lint_fixture("clean_chatml.jinja")[0] == []


# Nemotron 3's shape: reasoning or not, every turn prints an opener, but a turn without
# reasoning prints "<think></think>" where the reply was opened with "<think>\n".
EMPTY_OPENER_DIFFERS = (
    "{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% if m.reasoning_content %}{{ '<think>\\n' + m.reasoning_content + '</think>' }}{% else %}{{ '<think></think>' }}{% endif %}"
    "{{ m.content }}{% else %}{{ m.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant><think>\\n' }}{% endif %}"
)


def test_an_empty_opener_that_differs_from_the_generation_prompt_is_reported():
    codes, findings = lint_text(EMPTY_OPENER_DIFFERS)
    assert [(code, line) for code, line, _ in codes] == [("PC006", 1)]
    assert "history prints '<think></think>' for some turns" in findings[0].message


def test_an_empty_opener_matching_the_generation_prompt_is_clean():
    matching = EMPTY_OPENER_DIFFERS.replace("{{ '<think></think>' }}", "{{ '<think>\\n</think>' }}")
    assert lint_text(matching)[0] == []
