"""PC101: a render that exceeds the time or size limit is reported, not waited for."""

import json

from click.testing import CliRunner
from helpers import CORPUS

from tmpl_lint.cli import main


def test_fixture_is_stopped_by_the_size_limit_as_its_string_grows():
    # "ab" doubled: 2 * 2**19 = 1,048,576 characters is the first length past 1,000,000. It
    # was stopped by the time limit, after growing to gigabytes.
    result = CliRunner().invoke(main, [str(CORPUS / "PC101_render_limit_exceeded.jinja"), "--format", "json"])
    (finding,) = json.loads(result.stdout)
    assert (finding["code"], finding["line"], finding["column"]) == ("PC101", 1, 1)
    assert finding["message"] == (
        'render limit exceeded in "chat": a string joined with ~ reached 1048576 characters, over the 1000000 limit'
    )
    assert finding["proof"] == {"status": "not-provable", "unit": "char", "reason": finding["message"]}
    assert result.exit_code == 1


def test_a_sum_past_the_size_limit_is_stopped_before_it_is_made(tmp_path):
    path = tmp_path / "doubling.jinja"
    path.write_text(
        '{%- set ns = namespace(text="ab") %}{%- for i in range(40) %}{%- set ns.text = ns.text + ns.text %}{%- endfor %}'
        "{%- for m in messages %}{{ m.content }}{% endfor %}"
    )
    (finding,) = json.loads(CliRunner().invoke(main, [str(path), "--format", "json"]).stdout)
    assert finding["message"] == 'render limit exceeded in "chat": a sum would make 1048576 items, over the 1000000 limit'


def test_a_render_past_the_time_limit_is_stopped():
    hostile = CORPUS.parent / "tests" / "hostile" / "nested_loops.jinja"
    result = CliRunner().invoke(main, [str(hostile), "--format", "json", "--render-timeout", "0.2"])
    (finding,) = json.loads(result.stdout)
    assert (finding["code"], finding["message"]) == ("PC101", 'render limit exceeded in "chat": rendering took over 0.2 s')


def test_output_past_the_size_limit_is_stopped(tmp_path):
    path = tmp_path / "chatty.jinja"
    path.write_text("{% for i in range(100000) %}0123456789{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}")
    result = CliRunner().invoke(main, [str(path), "--format", "json", "--render-max-bytes", "1000"])
    (finding,) = json.loads(result.stdout)
    assert (finding["code"], finding["proof"]["status"]) == ("PC101", "not-provable")
    assert finding["message"].startswith('render limit exceeded in "chat": ')
    assert "1000" in finding["message"]
