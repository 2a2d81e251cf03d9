from helpers import at, lint_fixture, lint_text


def test_fixture_renamed_scan_is_found():
    codes, findings = lint_fixture("PC002_history_rewrite.jinja")
    assert codes == [("PC002", 13, 48)]
    assert "`state.newest_query` (set at line 6)" in findings[0].message
    assert findings[0].switch is None


def test_fixture_switch_named_with_stable_value():
    codes, findings = lint_fixture("PC002_history_rewrite_switch.jinja")
    assert codes == [("PC002", 11, 87)]
    switch = findings[0].switch
    assert (switch.name, switch.stable_value, switch.default_is_stable) == ("keep_history_reasoning", True, False)


def test_variable_named_last_query_index_that_changes_nothing():
    assert lint_fixture("clean_unused_last_query_index.jinja")[0] == []


def test_running_state_inside_the_render_loop_is_not_a_scan():
    source = (
        "{% set ns = namespace(seen_user=false) %}"
        "{% for m in messages %}"
        "{% if ns.seen_user %}{{ m.content }}{% endif %}"
        "{% if m.role == 'user' %}{% set ns.seen_user = true %}{% endif %}"
        "{% endfor %}"
    )
    assert lint_text(source)[0] == []


def test_scan_over_indices_is_found():
    source = (
        "{% set ns = namespace(last=-1) %}\n"
        "{% for i in range(messages|length) %}{% if messages[i].role == 'user' %}{% set ns.last = i %}{% endif %}{% endfor %}\n"
        "{% for m in messages %}{% if loop.index0 >= ns.last %}{{ m.reasoning_content }}{% endif %}{{ m.content }}{% endfor %}\n"
    )
    assert lint_text(source)[0] == [at("PC002", source, "ns.last %}")]


def test_split_of_messages_at_a_scanned_position_is_found():
    source = (
        "{% set ns = namespace(cut=0) %}\n"
        "{% for m in messages %}{% if m.role == 'user' %}{% set ns.cut = loop.index0 %}{% endif %}{% endfor %}\n"
        "{% for m in messages[:ns.cut] %}{{ m.content }}{% endfor %}\n"
    )
    assert lint_text(source)[0] == [at("PC002", source, "ns.cut]")]
