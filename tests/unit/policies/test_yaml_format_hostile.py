"""Regressions from fuzzing the YAML loader (tests/abuse/test_yaml_fuzz.py): documents that
raised instead of naming the problem, took exponential time, or named the wrong line."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
import yaml

from sluice.errors import ConfigError
from sluice.policies.yaml_format import load_path, load_text

RULE = "domain: d\ndescriptors:\n  - key: k\n"
LIMIT = RULE + "    rate_limit:\n      unit: second\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_text(text, "t.yaml")
    return info.value.problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Values the YAML constructor cannot read raised ValueError, KeyError or
        # ConstructorError out of the loader.
        (RULE + "    shadow_mode: 2001-13-45\n", "t.yaml:4: 'shadow_mode' must be true or false"),
        (RULE + "    shadow_mode: !!bool maybe\n", "t.yaml:4: 'shadow_mode' must be true or false"),
        (
            RULE + "    shadow_mode: !!timestamp x\n",
            "t.yaml:4: 'shadow_mode' must be true or false",
        ),
        (RULE + "    shadow_mode: !custom x\n", "t.yaml:4: 'shadow_mode' must be true or false"),
        (
            LIMIT + "      requests_per_unit: 0b_\n",
            "t.yaml:6: 'requests_per_unit' must be a whole number",
        ),
        (
            LIMIT + "      requests_per_unit: 0x_\n",
            "t.yaml:6: 'requests_per_unit' must be a whole number",
        ),
        (
            LIMIT + "      requests_per_unit: !!int x\n",
            "t.yaml:6: 'requests_per_unit' must be a whole number",
        ),
        # More digits than Python converts (4300) raised ValueError.
        (
            LIMIT + "      requests_per_unit: " + "9" * 5000 + "\n",
            "t.yaml:6: 'requests_per_unit' must be between 0 and 4294967295",
        ),
        (
            LIMIT + "      requests_per_unit: -" + "9" * 5000 + "\n",
            "t.yaml:6: 'requests_per_unit' must be between 0 and 4294967295",
        ),
        # Deep nesting raised RecursionError in the composer.
        ("domain: d\ndescriptors: " + "[" * 5000 + "\n", "t.yaml:2: nested deeper than 100 levels"),
        # A recursive alias raised RecursionError in the walk.
        (
            "domain: d\ndescriptors: &a\n  - key: k\n    descriptors: *a\n",
            "t.yaml:4: alias '*a' refers to a node that contains it",
        ),
        # A mapping as a key was reported as "unknown key 'None'".
        (
            "domain: d\n? [a, b]\n: c\n",
            "t.yaml:2: a key in a policy document must be a string, not a list",
        ),
        # NUL is not allowed in YAML: the line of the character, not always line 1.
        (
            "domain: d\ndescriptors:\n  - key: a\x00\n",
            "t.yaml:3: YAML syntax error: unacceptable character #x0000: special characters are "
            "not allowed",
        ),
        # YAML breaks lines at NEL too; the line is counted as editors count it.
        ("domain: d # \x85\ndescriptors: {key: k}\n", "t.yaml:2: 'descriptors' must be a list"),
    ],
)
def test_hostile_documents_name_the_line_and_the_problem(text: str, expected: str) -> None:
    assert problems(text) == [expected]


def alias_bomb(levels: int, fan_out: int) -> str:
    lines = ["domain: d", "descriptors:", "  - &l0 {key: lol}"]
    for n in range(1, levels):
        children = ", ".join([f"*l{n - 1}"] * fan_out)
        lines.append(f"  - &l{n} {{key: l{n}, descriptors: [{children}]}}")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    started = time.perf_counter()
    # 2 ** 40 nodes when expanded: this used to run until killed.
    assert problems(alias_bomb(40, 2)) == [
        "t.yaml:16: aliases expand this document by more than 100000 nodes "
        "(at alias '*l12', of 32763 nodes)"
    ]
    assert time.perf_counter() - started < 1.0


def test_loading_keeps_no_document_alive() -> None:
    # SafeConstructor.construct_object remembered every node it built, in a module global.
    text = LIMIT + "      requests_per_unit: 5\n    shadow_mode: true\n"
    load_text(text, "t.yaml")
    gc.collect()
    before = sum(isinstance(o, yaml.Node) for o in gc.get_objects())
    for _ in range(50):
        load_text(text, "t.yaml")
    gc.collect()
    assert sum(isinstance(o, yaml.Node) for o in gc.get_objects()) == before


def test_a_file_that_is_not_utf8_is_a_problem_with_a_line(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_bytes(b"domain: a\ndescriptors:\n  - key: \xe9\n")
    (tmp_path / "b.yaml").write_text("domain: b\ncolour: red\n")
    with pytest.raises(ConfigError) as info:
        load_path(tmp_path)
    assert info.value.problems == [
        f"{tmp_path / 'a.yaml'}:3: not UTF-8 text (at byte offset 32)",
        f"{tmp_path / 'b.yaml'}:2: unknown key 'colour' in a policy document",
    ]


def test_files_with_crlf_or_cr_line_ends_number_lines_as_editors_do(tmp_path: Path) -> None:
    (tmp_path / "crlf.yaml").write_bytes(b"domain: a\r\ncolour: red\r\n")
    (tmp_path / "cr.yaml").write_bytes(b"domain: b\rcolour: red\r")
    with pytest.raises(ConfigError) as info:
        load_path(tmp_path)
    assert info.value.problems == [
        f"{tmp_path / 'cr.yaml'}:2: unknown key 'colour' in a policy document",
        f"{tmp_path / 'crlf.yaml'}:2: unknown key 'colour' in a policy document",
    ]
