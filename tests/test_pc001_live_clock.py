import json
import os
from datetime import date, datetime

import pytest
from click.testing import CliRunner
from helpers import CORPUS, at, lint_fixture, lint_text, prove_fixture, prove_text, without_edits

from tmpl_lint.cli import main
from tmpl_lint.proofs import AFTER_MESSAGES, BEFORE_MESSAGES, Cause
from tmpl_lint.proving.session import Prover


def test_fixture_clock_through_macro():
    codes, findings = lint_fixture("PC001_live_clock.jinja")
    assert codes == [("PC001", 3, 28)]
    assert findings[0].switch is None
    assert findings[0].source_line.strip().startswith('{{- "Current date: "')


def test_fixture_default_system_prompt_names_the_switch():
    codes, findings = lint_fixture("PC001_live_clock_default_system.jinja")
    assert codes == [("PC001", 2, 21)]
    finding = findings[0]
    assert "default system prompt" in finding.message
    assert finding.switch.name == "today"
    assert finding.switch.default_is_stable is False
    assert isinstance(finding.switch.stable_value, str)
    assert "chat_template_kwargs" in finding.full_message()
    assert "--default-chat-template-kwargs" in finding.full_message()


@pytest.mark.parametrize("fixture", ["clean_clock_never_printed.jinja", "clean_fixed_date_default.jinja"])
def test_clean_fixtures(fixture):
    assert lint_fixture(fixture)[0] == []


@pytest.mark.parametrize(
    ("source", "anchors"),
    [
        # printed directly
        ('{{ strftime_now("%Y") }}', ["strftime_now"]),
        # through a set and a namespace
        ('{% set ns = namespace(d=strftime_now("%Y")) %}{{ "x" + ns.d }}', ["strftime_now"]),
        # decides what is printed without being printed
        ('{% if strftime_now("%d") == "01" %}monthly{% endif %}', ["strftime_now"]),
        # computed, never printed: noop
        ('{% set today = strftime_now("%Y") %}{{ messages[0].content }}', []),
        # a local macro that shadows the name is not the clock: noop
        ("{% macro strftime_now(f) %}2024{% endmacro %}{{ strftime_now('%Y') }}", []),
        # a template variable named like a date, not a call: noop
        ("{{ current_date }}", []),
    ],
)
def test_cases(source, anchors):
    assert lint_text(source)[0] == [at("PC001", source, anchor) for anchor in anchors]


# -- proven by the clock, with how often the prompt changes --------------------------------


def test_a_date_under_if_tools_is_proven_only_where_tools_are_sent():
    codes, (finding,) = prove_fixture("PC001_clock_under_tools.jinja")
    assert codes == [("PC001", 4, 43)]
    divergence = finding.proof.divergence
    assert divergence.scenario == "clock with tools, a day later"
    # "Today is 02 March 2026" against "03 March": the day's second digit, counted by hand
    assert divergence.first_divergence == len("<|im_start|>system\nToday is 0")
    # the template's own system block, printed before the loop: before the first message
    assert (divergence.message_index, divergence.field, divergence.cause) == (None, BEFORE_MESSAGES, "system")
    assert finding.message.endswith("; the rendered prompt changes per day: it changed when the clock moved a day")
    # only the shapes with tools show it; the first is stepped, finest step first, until one
    # changes the render: a second, a minute, an hour, half a day did not, a day did
    shown = {scenario for scenario, _ in finding.proof.explains}
    assert shown == {
        "clock with tools, everything later",
        "clock with system and tools, everything later",
        "clock with tools, a day later",
    }
    report = Prover((CORPUS / "PC001_clock_under_tools.jinja").read_text(), None).run({})
    steps = [name for name in report.tried() if name.startswith("clock") and not name.endswith("everything later")]
    assert steps == [f"clock with tools, {step} later" for step in ("a second", "a minute", "an hour", "half a day", "a day")]


def test_a_clock_to_the_minute_changes_the_prompt_every_minute():
    codes, (finding,) = prove_fixture("PC001_clock_per_minute.jinja")
    assert codes == [("PC001", 2, 36)]
    divergence = finding.proof.divergence
    assert divergence.scenario == "clock, a minute later"
    assert divergence.first_divergence == len("<|im_start|>system\nIt is 12:0")  # 12:00 against 12:01
    assert finding.message.endswith("; the rendered prompt changes per minute: it changed when the clock moved a minute")


MIDDAY = datetime(2026, 3, 1, 12)  # a Sunday: the first day of a %U week, the last of a %W week


@pytest.mark.parametrize(
    ("format", "granularity", "step", "earlier", "later"),
    [
        ("%H:%M:%S", "per request", "a second", MIDDAY, datetime(2026, 3, 1, 12, 0, 1)),
        ("%H:%M", "per minute", "a minute", MIDDAY, datetime(2026, 3, 1, 12, 1)),
        ("%H", "per hour", "an hour", MIDDAY, datetime(2026, 3, 1, 13)),
        # AM/PM: 13:00 is still PM; only midnight -> noon (or noon -> midnight) changes it
        ("%p", "twice a day", "half a day", datetime(2026, 3, 1, 0), MIDDAY),
        # 12 AM and 12 PM print the same hour: the hour step (12 -> 01) changes it first
        ("%I %p", "per hour", "an hour", MIDDAY, datetime(2026, 3, 1, 13)),
        # Monday -> Tuesday: inside a Sunday-first and a Monday-first week
        ("%A", "per day", "a day", datetime(2026, 3, 2, 12), datetime(2026, 3, 3, 12)),
        ("%Y-%m-%d", "per day", "a day", datetime(2026, 3, 2, 12), datetime(2026, 3, 3, 12)),
        # week numbers: Sunday-first 09 -> 10, Monday-first 08 -> 09; a day never changes them
        ("%U", "per week", "a week", MIDDAY, datetime(2026, 3, 8, 12)),
        ("%W %Y", "per week", "a week", MIDDAY, datetime(2026, 3, 8, 12)),
        ("%B", "per month", "a month", MIDDAY, datetime(2026, 4, 1, 12)),
        ("%m", "per month", "a month", MIDDAY, datetime(2026, 4, 1, 12)),
        ("%B %Y", "per month", "a month", MIDDAY, datetime(2026, 4, 1, 12)),
        ("%Y", "per year", "a year", MIDDAY, datetime(2027, 3, 1, 12)),
    ],
)
def test_the_finding_says_how_often_the_prompt_changes(format, granularity, step, earlier, later):
    source = "{{ 'Now: ' + strftime_now('" + format + "') }}{% for m in messages %}{{ m.content }}{% endfor %}"
    (finding,) = prove_text(source)[1]
    assert finding.message.endswith(f"; the rendered prompt changes {granularity}: it changed when the clock moved {step}")
    before, after = earlier.strftime(format), later.strftime(format)
    assert before != after
    assert finding.proof.divergence.first_divergence == len("Now: ") + len(os.path.commonprefix([before, after]))
    assert finding.proof.divergence.scenario == f"clock, {step} later"


@pytest.mark.parametrize(
    ("step", "unchanged"),
    [
        ("a second", "%Y %m %U %W %d %p %H %M"),
        ("a minute", "%Y %m %U %W %d %p %H"),
        ("an hour", "%Y %m %U %W %d %p"),
        ("half a day", "%Y %m %U %W %d %I %M %S"),
        ("a day", "%Y %m %U %W %p %H %M %S"),
        ("a week", "%Y %m %p %H %M %S"),
        ("a month", "%Y %p %H %M %S"),
    ],
)
def test_each_clock_step_leaves_every_coarser_field_as_it_was(step, unchanged):
    # how often the prompt changes is the finest step that changes it: a step that also moved
    # a coarser field (a day from Sunday to Monday moves a Monday-first week) would name the
    # wrong rate
    from tmpl_lint.scenarios import CLOCK_STEPS, EVERYTHING_LATER

    (moved,) = [candidate for candidate in CLOCK_STEPS if candidate.name == step]
    assert moved.earlier.strftime(unchanged) == moved.later.strftime(unchanged)
    # the probe that decides whether the steps are rendered moves every field
    for field in ["%Y", "%m", "%U", "%W", "%d", "%p", "%I", "%H", "%M", "%S", "%a"]:
        assert MIDDAY.strftime(field) != EVERYTHING_LATER.strftime(field), field


def test_a_template_without_a_clock_renders_no_clock_step():
    report = Prover((CORPUS / "clean_chatml.jinja").read_text(), None).run({})
    tried = report.tried()
    assert "clock with system and tools, everything later" in tried
    assert not [name for name in tried if name.startswith("clock") and not name.endswith("everything later")]


def test_the_advised_date_is_written_in_the_templates_own_format():
    # Llama 3.x: date_string defaults to the clock as "%d %b %Y" ("26 Jul 2024").
    source = (
        '{%- if not date_string is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- endif %}\n'
        '{{- "Today Date: " + date_string }}{% for m in messages %}{{ m.content }}{% endfor %}'
    )
    _, (finding,) = lint_text(source)
    assert finding.switch.name == "date_string"
    assert finding.switch.stable_value == date.today().strftime("%d %b %Y")
    assert f"set date_string={date.today().strftime('%d %b %Y')!r} to avoid it" in finding.full_message()


# -- where the clock is, outside every message ----------------------------------------------


@pytest.mark.parametrize("format", ["full", "json", "sarif", "github"])
def test_a_clock_before_the_first_message_is_located_there_in_every_report(format):
    # The fixture prints its system block before the loop; the clock scenario sends one user
    # message. "<|im_start|>system\nIt is 12:00" against 12:01: char 29, counted by hand.
    result = CliRunner().invoke(main, [str(CORPUS / "PC001_clock_per_minute.jinja"), "--format", format])
    assert result.exit_code == 1, result.output
    if format == "full":
        assert "first divergence at char 29, before the first message, cause system" in result.stdout
        assert "message 0" not in result.stdout
    elif format == "json":
        (finding,) = json.loads(result.stdout)
        proof = finding["proof"]
        assert (proof["first_divergence_char"], proof["message_index"], proof["role"]) == (29, None, None)
        assert (proof["field"], proof["cause"]) == ("before-messages", "system")
    elif format == "sarif":
        (outcome,) = json.loads(result.stdout)["runs"][0]["results"]
        proof = outcome["properties"]["proof"]
        assert (proof["message_index"], proof["field"], proof["cause"]) == (None, "before-messages", "system")
    else:
        # an annotation carries the finding's place in the template, not the proof's
        assert result.stdout.startswith("::warning file=" + str(CORPUS / "PC001_clock_per_minute.jinja") + ",line=2,col=36,")


CLOCK_AFTER_THE_MESSAGES = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    'Today: {{ strftime_now("%Y") }}\n{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
)


def test_a_clock_after_the_last_message_is_located_there_and_is_no_history_rewrite():
    # /tmp/qa8/tt/d.jinja of the QA: "message 0 (user, markup), cause history-rewrite" where
    # the clock scenario added no message. The year moves, after the user message's text.
    _, findings = prove_text(CLOCK_AFTER_THE_MESSAGES)
    (clock,) = [finding for finding in findings if finding.code == "PC001"]
    assert clock.fails()
    divergence = clock.proof.divergence
    assert divergence.scenario == "clock, a year later"
    assert divergence.first_divergence == len("<|im_start|>user\nWhat is the capital of France?<|im_end|>\nToday: 202")
    assert (divergence.message_index, divergence.role, divergence.field) == (None, None, AFTER_MESSAGES)
    assert divergence.cause is Cause.AFTER_HISTORY
    assert divergence.place == "after the last message"


def test_the_fix_header_goes_after_a_byte_order_mark(tmp_path):
    # The default for the date is written first in the template: after the file's byte order
    # mark, which stays its first three bytes; the rest of the file follows the header as it was.
    path = tmp_path / "chat_template.jinja"
    body = '{{ strftime_now("%Y-%m-%d") }}{% for m in messages %}{{ m.content }}{% endfor %}\n'
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15"])
    header = '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
    fixed = body.replace('strftime_now("%Y-%m-%d")', "date_string")
    assert path.read_bytes() == b"\xef\xbb\xbf" + (header + fixed).encode()
    assert result.exit_code == 0


# -- the fix freezes the clock at the moment its verifier renders the original at -----------

CLOCK_IN_THE_SYSTEM_BLOCK = (
    "{{ bos_token }}<|im_start|>system\nNow: {{ strftime_now(FORMAT) }}<|im_end|>\n"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def hf_render(template: str, at: datetime | None, **kwargs) -> str:
    """The template as transformers renders it (its jinja2 settings), the clock stopped at ``at``:
    none of tmpl-lint's code."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    if at is not None:
        environment.globals["strftime_now"] = at.strftime
    messages = [{"role": "user", "content": "Hello"}]
    return environment.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token="<s>", **kwargs)


@pytest.mark.parametrize(
    ("format", "variable", "frozen"),
    [
        ("%Y-%m-%d", "date_string", "2026-01-15"),
        ("%Y-%m-%d %H:%M:%S", "datetime_string", "2026-01-15 12:00:00"),
        ("%H:%M", "time_string", "12:00"),
        ("%p", "time_string", "PM"),
    ],
)
def test_a_clock_with_the_time_of_day_is_fixed_at_noon_of_the_fix_date(tmp_path, format, variable, frozen):
    # the fix froze the clock at midnight, its verifier rendered the original at noon:
    # "%H:%M" printed 00:00 against 12:00 and every clock with an hour was "not fixed: a
    # single-turn conversation would render differently".
    original = CLOCK_IN_THE_SYSTEM_BLOCK.replace("FORMAT", repr(format))
    path = tmp_path / "chat_template.jinja"
    path.write_text(original)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{path}:2:9: fixed PC001 [live-clock]: ")
    header = f'{{%- if {variable} is not defined %}}{{%- set {variable} = "{frozen}" %}}{{%- endif %}}\n'
    assert path.read_text() == header + original.replace(f"strftime_now({format!r})", variable)
    # what the model sees without the variable: the original at noon of the fix date
    fixed = path.read_text()
    assert (
        hf_render(fixed, None)
        == hf_render(original, datetime(2026, 1, 15, 12))
        == f"<s><|im_start|>system\nNow: {frozen}" + ("<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    )
    # and a caller still passes the real time
    assert "Now: 09:41<|im_end|>" in hf_render(fixed, None, **{variable: "09:41"})


@pytest.mark.parametrize(
    ("format", "title"),
    [
        ("%d %b %Y", "the date 15 Jan 2026 instead of today's unless the caller passes date_string"),
        ("%A", "the weekday Thursday instead of today's unless the caller passes weekday_string"),
        ("%H:%M", "the time 12:00 instead of the current one unless the caller passes time_string"),
        ("%c", "the date and time Thu Jan 15 12:00:00 2026 instead of the current one unless the caller passes datetime_string"),
    ],
)
def test_the_variable_a_fixed_clock_is_passed_in_is_named_after_what_it_shows(tmp_path, format, title):
    # A weekday or a time of day in `date_string`, the variable callers pass a date in, would
    # be a value of the wrong kind for them to pass.
    path = tmp_path / "chat_template.jinja"
    path.write_text(CLOCK_IN_THE_SYSTEM_BLOCK.replace("FORMAT", repr(format)))
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15"])
    assert (result.exit_code, without_edits(result.stdout)) == (
        0,
        f"{path}:2:9: fixed PC001 [live-clock]: the model sees {title}\nFound 1 finding (1 fixed, 0 remaining).\n",
    )


def test_two_clock_calls_on_one_line_are_both_fixed(tmp_path):
    # one line, two calls: one finding, whose fix edited the first call only and then
    # refused itself ("PC001 is still found in the patched template, at line 3, column 32").
    original = (
        '{{- bos_token }}<|im_start|>system\nToday is {{ strftime_now("%Y-%m-%d") }} ({{ strftime_now("%Y-%m-%d") }}).'
        "<|im_end|>\n{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    path = tmp_path / "chat_template.jinja"
    path.write_text(original)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15"])
    assert (result.exit_code, without_edits(result.stdout)) == (
        0,
        f"{path}:2:13: fixed PC001 [live-clock]: the model sees the date 2026-01-15 instead of today's unless the caller "
        "passes date_string\nFound 1 finding (1 fixed, 0 remaining).\n",
    )
    header = '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
    assert path.read_text() == header + original.replace('strftime_now("%Y-%m-%d")', "date_string")
    assert CliRunner().invoke(main, [str(path)]).exit_code == 0


def test_clocks_in_two_formats_are_each_fixed_in_their_own_variable(tmp_path):
    # "%A" then "%Y-%m-%d", on two lines. The weekday's fix set date_string to
    # "Thursday"; the date's was refused, and the file was left half rewritten and failing.
    original = (
        '{{- bos_token }}<|im_start|>system\nToday is {{ strftime_now("%A") }},\n{{ strftime_now("%Y-%m-%d") }}.'
        "<|im_end|>\n{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    path = tmp_path / "chat_template.jinja"
    path.write_text(original)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15"])
    title = (
        "the model sees the weekday Thursday and the date 2026-01-15 instead of the current ones unless the caller "
        "passes weekday_string and date_string"
    )
    assert (result.exit_code, without_edits(result.stdout)) == (
        0,
        f"{path}:2:13: fixed PC001 [live-clock]: {title}\n{path}:3:4: fixed PC001 [live-clock]: {title}\nFound 2 findings (2 fixed, 0 remaining).\n",
    )
    fixed = path.read_text()
    assert fixed == (
        '{%- if weekday_string is not defined %}{%- set weekday_string = "Thursday" %}{%- endif %}\n'
        '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
        + original.replace('strftime_now("%A")', "weekday_string").replace('strftime_now("%Y-%m-%d")', "date_string")
    )
    # one moment in both, as the original printed it at noon of the fix date
    assert hf_render(fixed, None) == hf_render(original, datetime(2026, 1, 15, 12))
    assert "Today is Thursday,\n2026-01-15." in hf_render(fixed, None)
    assert CliRunner().invoke(main, [str(path)]).exit_code == 0


def test_a_clock_whose_format_is_not_literal_refuses_the_whole_fix(tmp_path):
    # Freezing the literal one alone would leave the clock live in the other, on the same line
    # (one finding): the file is left as it was, with the reason.
    original = "{{ strftime_now('%Y') }} {{ strftime_now(fmt) }}{% for m in messages %}{{ m.content }}{% endfor %}"
    path = tmp_path / "chat_template.jinja"
    path.write_text(original)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15"])
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0] == (
        f"{path}:1:4: not fixed PC001 [live-clock]: the clock's format at line 1 is not a literal string, "
        "nor a variable set to one"
    )
    assert path.read_text() == original


CLOCK_ALIAS = (
    "{%- set clock = CLOCK %}\n"
    "{{- '<|system|>Date: ' + clock('%Y-%m-%d') + '<|end|>\\n' }}\n"
    "{%- for m in messages %}{{- '<|' + m.role + '|>' + m.content + '<|end|>\\n' }}{%- endfor %}"
)

pytestmark = pytest.mark.no_fork


@pytest.mark.parametrize("clock", ["strftime_now", "now"])
def test_a_clock_called_through_a_name_it_was_set_to_is_found(clock):
    """`{% set clock = strftime_now %}` then `clock(...)`: the proof saw the date move the
    prompt, and with no finding to name it reported PC100 'no rule explains why'."""
    source = CLOCK_ALIAS.replace("CLOCK", clock)
    assert lint_text(source)[0] == [at("PC001", source, "clock(")]


def test_a_clock_called_through_a_name_it_was_set_to_is_proven_and_fixed(tmp_path):
    original = CLOCK_ALIAS.replace("CLOCK", "strftime_now")
    codes, (finding,) = prove_text(original)
    assert codes == [at("PC001", original, "clock(")]
    assert finding.proof.is_proven
    path = tmp_path / "chat_template.jinja"
    path.write_text(original)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15"])
    _, line, column = at("PC001", original, "clock(")
    assert (result.exit_code, without_edits(result.stdout)) == (
        0,
        f"{path}:{line}:{column}: fixed PC001 [live-clock]: the model sees the date 2026-01-15 instead of today's "
        "unless the caller passes date_string\nFound 1 finding (1 fixed, 0 remaining).\n",
    )
    header = '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
    assert path.read_text() == header + original.replace("clock('%Y-%m-%d')", "date_string")


CLOCK_HELD = {
    # the clock kept in a namespace attribute, in a list, or called with a format held in a variable
    "namespace": ("{%- set ns = namespace(clock=strftime_now) %}", "ns.clock('%Y-%m-%d')", "ns.clock("),
    "list": ("{%- set clocks = [strftime_now] %}", "clocks[0]('%Y-%m-%d')", "clocks[0]("),
    "format variable": ("{%- set fmt = '%Y-%m-%d' %}", "strftime_now(fmt)", "strftime_now("),
}


def clock_held(kind: str) -> tuple[str, str, str]:
    setup, call, anchor = CLOCK_HELD[kind]
    source = (
        f"{setup}\n"
        f"{{{{- '<|system|>Date: ' + {call} + '<|end|>\\n' }}}}\n"
        "{%- for m in messages %}{{- '<|' + m.role + '|>' + m.content + '<|end|>\\n' }}{%- endfor %}"
    )
    return source, call, anchor


@pytest.mark.parametrize("kind", list(CLOCK_HELD))
def test_a_clock_held_in_a_namespace_or_a_list_is_proven_at_its_call_and_fixed(tmp_path, kind):
    """`namespace(clock=strftime_now)` then `ns.clock(...)`, or `[strftime_now]` then
    `clocks[0](...)`: the clock's scenarios saw the date move the prompt, and with no finding
    to name it that was PC100 "no rule explains why", with no fix; a format held in
    a variable set to a literal was "not fixed: the clock's format ... is not a literal string"."""
    original, call, anchor = clock_held(kind)
    codes, findings = prove_text(original)
    assert codes == [at("PC001", original, anchor)]
    assert findings[0].proof.is_proven
    path = tmp_path / "chat_template.jinja"
    path.write_text(original)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--frozen-date", "2026-01-15"])
    _, line, column = at("PC001", original, anchor)
    assert (result.exit_code, without_edits(result.stdout)) == (
        0,
        f"{path}:{line}:{column}: fixed PC001 [live-clock]: the model sees the date 2026-01-15 instead of today's "
        "unless the caller passes date_string\nFound 1 finding (1 fixed, 0 remaining).\n",
    )
    header = '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
    assert path.read_text() == header + original.replace(call, "date_string")


def test_a_format_variable_a_caller_may_pass_refuses_the_fix(tmp_path):
    """The format folds to one string only where the template alone sets it: a default a
    caller may override is not frozen in one format."""
    original = (
        "{%- if fmt is not defined %}{%- set fmt = '%Y-%m-%d' %}{%- endif %}\n"
        "{{- strftime_now(fmt) }}{%- for m in messages %}{{ m.content }}{%- endfor %}"
    )
    path = tmp_path / "chat_template.jinja"
    path.write_text(original)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove"])
    assert result.stdout.splitlines()[0] == (
        f"{path}:2:5: not fixed PC001 [live-clock]: the clock's format at line 2 is not a literal string, "
        "nor a variable set to one"
    )
    assert path.read_text() == original


def test_a_date_only_in_the_generation_prompt_is_not_reproduced_and_says_the_clock_moved_it():
    """The clock steps change the generation prompt, which the next turn replaces with the
    reply: no cached prefix is lost, so PC001 is not proven, but the finding says where the
    clock moved the render instead of reading as if nothing changed."""
    source = (
        "{%- set ns = namespace(d=strftime_now('%Y-%m-%d')) %}\n"
        "{%- for m in messages %}{{- '<|' + m.role + '|>' + m.content + '<|end|>\\n' }}{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|assistant|>(as of ' + ns.d + ')' }}{%- endif %}"
    )
    codes, findings = prove_text(source)
    clock = [finding for finding in findings if finding.code == "PC001"]
    assert [(f.code, f.line, f.column) for f in clock] == [at("PC001", source, "strftime_now")]
    assert clock[0].proof.status == "not-reproduced" and not clock[0].fails()
    # "everything later" moves the year first: its last digit, counted by hand
    moved = len("<|user|>What is the capital of France?<|end|>\n<|assistant|>(as of 202")
    assert clock[0].message.endswith(
        f'; the clock changes only the generation prompt ("clock, everything later", char {moved}), '
        "which the next turn replaces with the reply: no cached prefix is lost"
    )
