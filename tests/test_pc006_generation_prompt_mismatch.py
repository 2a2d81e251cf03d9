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
