"""Fuzzing the YAML policy loader (what `sluice check`, `sluice import` and the API run).

Documents close to valid (examples/ratelimit.yaml with values of the wrong type, keys
missing, renamed or duplicated, huge numbers, deep nesting, odd unicode, shared nodes that
become anchors and aliases, then lines duplicated, dropped or garbled), documents built
from anchors and aliases (alias bombs among them), and random text. The loader either
returns policies, which dump and load back unchanged, or raises ConfigError whose every
problem is ``SOURCE:LINE: reason`` with a line inside the document; nothing else, ever.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from sluice.errors import ConfigError
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import (
    MAX_ALIAS_NODES,
    MAX_DEPTH,
    dump_policies,
    load_path,
    load_text,
)
from tests.abuse._volume import TIMEOUT_S, cases

pytestmark = pytest.mark.timeout(TIMEOUT_S)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "examples" / "ratelimit.yaml").read_text()
SOURCE = "fuzz.yaml"
PROBLEM = re.compile(r"fuzz\.yaml:(\d+): (\S.*)", re.DOTALL)


def check(text: str) -> None:
    """The loader's contract on any text: policies that round-trip, or problems naming lines."""
    try:
        policies = load_text(text, SOURCE)
    except ConfigError as exc:
        assert exc.problems, "a ConfigError without problems"
        last_line = text.count("\n") + 1
        for problem in exc.problems:
            match = PROBLEM.fullmatch(problem)
            assert match, f"not SOURCE:LINE: reason: {problem!r}"
            assert 1 <= int(match[1]) <= last_line, (problem, last_line)
        event(f"refused: {len(exc.problems) > 1 and 'several problems' or 'one problem'}")
        return
    event(f"loaded {len(policies) and 'policies' or 'nothing'}")
    # What loads can be served, and exported then imported again unchanged.
    Snapshot(policies)
    assert load_text(dump_policies(policies), "dumped.yaml") == policies


# --- documents close to valid ---------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 2**32 - 1, 2**32, 2**63, 10**30, -(10**30), 10**4000]),
    st.integers(),
    st.floats(),  # nan and infinities included
    st.sampled_from(
        ["", "*", "second", "Second", "fortnight", "unknown", "gcra", "sliding_window_log"]
        + ["0x_", "0b_", "2001-13-45", "1:60", "~", "null", "yes", "no", "on", ".inf", "-.nan"]
        + ["\x00", "\u200f", "\u0301", "😀", "\ufeff", "a\nb", "'", '"', "&a", "*a", "!!int x"]
    ),
    st.text(max_size=20),
)


# Deep nesting is written into the text after dumping (PyYAML's dumper recurses too).
DEEP = re.compile(r"DEEP(\d+)")


def deepen(text: str) -> str:
    return DEEP.sub(lambda m: "[" * int(m[1]) + "x" + "]" * int(m[1]), text)


junk = st.one_of(
    scalars,
    st.lists(scalars, max_size=4),
    st.dictionaries(st.sampled_from(["key", "value", "unit", "name", "x"]), scalars, max_size=3),
    st.integers(MAX_DEPTH - 10, MAX_DEPTH + 50).map(lambda n: f"DEEP{n}"),
)
KEYS = (
    ["domain", "descriptors", "key", "value", "rate_limit", "shadow_mode", "detailed_metric"]
    + ["share_threshold", "name", "replaces", "unit", "requests_per_unit", "unlimited"]
    + ["algorithm", "burst", "limits", "Unit", "unit ", "colour", "concurrency", "lease_ttl"]
)


def places(node: Any, path: tuple = ()) -> list[tuple]:
    """Every path to a value inside ``node`` (dict keys and list indexes)."""
    found = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += places(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += places(value, (*path, i))
    return found


def reaches(node: Any, target: Any) -> bool:
    """Whether ``target`` is ``node`` or inside it (by identity)."""
    if node is target:
        return True
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    return any(reaches(child, target) for child in children)


def parent(document: Any, path: tuple) -> Any:
    for step in path[:-1]:
        document = document[step]
    return document


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    document = copy.deepcopy(yaml.safe_load(EXAMPLE))
    for _ in range(draw(st.integers(0, 4))):
        paths = places(document)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        container, last = parent(document, path), path[-1]
        operation = draw(
            st.sampled_from(["replace", "delete", "rename", "add", "duplicate", "share", "wrap"])
        )
        if operation == "replace":
            container[last] = draw(junk)
        elif operation == "delete":
            del container[last]
        elif operation == "rename" and isinstance(container, dict):
            container[draw(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)))] = container.pop(
                last
            )
        elif operation == "add" and isinstance(container, dict):
            container[draw(st.sampled_from(KEYS))] = draw(junk)
        elif operation == "duplicate" and isinstance(container, list):
            container.insert(last, copy.deepcopy(container[last]))
        elif operation == "share":
            # The same object in two places: safe_dump writes it as an anchor and an alias.
            source = draw(st.sampled_from(paths))
            shared = parent(document, source)[source[-1]]
            if not reaches(shared, container):  # no cycles: the dumper cannot write them
                container[last] = shared
        elif operation == "wrap":
            container[last] = draw(st.sampled_from([[container[last]], {"x": container[last]}]))
    return document


@st.composite
def mutated_texts(draw: st.DrawFn) -> str:
    document = draw(mutated_documents())
    text = yaml.safe_dump(
        document,
        allow_unicode=draw(st.booleans()),
        default_flow_style=draw(st.sampled_from([False, None, True])),
        sort_keys=False,
    )
    lines = deepen(text).splitlines(keepends=True)
    for _ in range(draw(st.integers(0, 3))):
        if not lines:
            break
        at = draw(st.integers(0, len(lines) - 1))
        operation = draw(st.sampled_from(["duplicate", "drop", "insert", "indent", "garble"]))
        if operation == "duplicate":  # duplicate keys, most of the time
            lines.insert(at, lines[at])
        elif operation == "drop":
            del lines[at]
        elif operation == "insert":
            lines.insert(at, draw(st.text(YAMLISH, max_size=30)) + "\n")
        elif operation == "indent":
            lines[at] = " " * draw(st.integers(1, 6)) + lines[at]
        else:
            cut = draw(st.integers(0, len(lines[at])))
            lines[at] = lines[at][:cut] + draw(st.text(YAMLISH, max_size=5)) + lines[at][cut:]
    return "".join(lines)


# --- documents made of anchors and aliases --------------------------------------------------------


@st.composite
def alias_texts(draw: st.DrawFn) -> str:
    """A policy whose descriptors are built from anchored nodes, each aliasing earlier ones
    (``fan_out`` aliases per level, ``levels`` deep): fan_out ** levels nodes when expanded,
    from a few lines of text. Sometimes an alias refers to its own ancestor."""
    levels = draw(st.integers(1, 30))
    fan_out = draw(st.integers(1, 10))
    lines = [
        "domain: d",
        "descriptors:",
        "  - &n0 {key: k0, rate_limit: {unit: second, requests_per_unit: 1}}",
    ]
    for level in range(1, levels):
        children = ", ".join(f"*n{level - 1}" for _ in range(fan_out))
        lines.append(f"  - &n{level} {{key: k{level}, descriptors: [{children}]}}")
    if draw(st.booleans()):  # a recursive alias: a node that contains itself
        lines.append(f"  - &loop {{key: again, descriptors: [*n{levels - 1}, *loop]}}")
    return "\n".join(lines) + "\n"


# --- random text ----------------------------------------------------------------------------------

YAMLISH = st.sampled_from(
    list("-:{}[],&*!|>'\"#%@`?~ \t\nab01.") + ["\u200f", "😀", "\x00", "\x85", "\ufeff"]
)
random_texts = st.one_of(
    st.text(max_size=200),
    st.text(YAMLISH, max_size=200),
    st.builds(
        lambda prefix, rest: prefix + rest,
        st.just("domain: d\ndescriptors:\n"),
        st.text(YAMLISH, max_size=200),
    ),
)


# --- the tests ------------------------------------------------------------------------------------

FUZZ = settings(
    max_examples=cases(ci=300, nightly=15_000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.slow
@FUZZ
@given(text=mutated_texts())
# Regressions: each of these raised instead of naming the problem.
@example(text="domain: d\ndescriptors:\n  - key: k\n    shadow_mode: 2001-13-45\n")
@example(
    text="domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
    "requests_per_unit: 0b_}\n"
)
@example(
    text="domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
    "requests_per_unit: " + "9" * 5000 + "}\n"
)
@example(text="domain: d\ndescriptors:\n  - key: k\n    detailed_metric: !!bool maybe\n")
@example(text="domain: d\ndescriptors:\n  - key: k\n    shadow_mode: !!python/name:os.system x\n")
@example(text="domain: d\ndescriptors:\n  - key: k\n    shadow_mode: !!timestamp junk\n")
@example(text="domain: d\ndescriptors: " + "[" * (MAX_DEPTH + 1000) + "\n")
@example(text="domain: d\ndescriptors: &a\n  - key: k\n    descriptors: *a\n")
@example(text="domain: d\n? [a, b]\n: c\n")
def test_near_valid_documents(text: str) -> None:
    check(text)


@pytest.mark.slow
@FUZZ
@given(text=alias_texts())
def test_anchors_and_aliases_are_refused_quickly_when_they_explode(text: str) -> None:
    started = time.perf_counter()
    check(text)
    assert time.perf_counter() - started < 2.0


@FUZZ
@given(text=random_texts)
@example(text="domain: d\x00\n")
@example(text="domain: d\ndescriptors:\n  - key: k\n\x85  value: \x07\n")
def test_random_text(text: str) -> None:
    check(text)


# --- the alias bomb, and what `sluice check` makes of it ------------------------------------------

# The classic "billion laughs": 9 levels of 9 aliases, 9**9 = 387 million leaves when expanded.
BILLION_LAUGHS = (
    "\n".join(
        ["domain: d", "descriptors:", '  - &l0 {key: lol, value: "lol"}']
        + [
            f"  - &l{n} {{key: l{n}, descriptors: [{', '.join([f'*l{n - 1}'] * 9)}]}}"
            for n in range(1, 10)
        ]
    )
    + "\n"
)


def test_a_billion_laughs_is_refused_before_it_expands() -> None:
    started = time.perf_counter()
    with pytest.raises(ConfigError) as refused:
        load_text(BILLION_LAUGHS, SOURCE)
    elapsed = time.perf_counter() - started
    assert refused.value.problems == [
        f"fuzz.yaml:8: aliases expand this document by more than {MAX_ALIAS_NODES} nodes "
        "(at alias '*l4', of 36905 nodes)"
    ]
    assert elapsed < 0.5, elapsed


def test_a_document_with_a_few_aliases_still_loads() -> None:
    text = (
        "domain: d\ndescriptors:\n"
        "  - key: a\n    rate_limit: &per_second {unit: second, requests_per_unit: 5}\n"
        "  - key: b\n    rate_limit: *per_second\n"
    )
    [policy] = load_text(text, SOURCE)
    assert policy.descriptors[0].limits == policy.descriptors[1].limits


def test_sluice_check_refuses_the_bomb_and_bad_files_with_a_line(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(BILLION_LAUGHS)
    (tmp_path / "binary.yaml").write_bytes(b"domain: d\ndescriptors:\n  - key: \xff\xfe\n")
    result = subprocess.run(
        [sys.executable, "-m", "sluice", "check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result
    assert result.stderr.splitlines() == [
        f"{tmp_path / 'binary.yaml'}:3: not UTF-8 text (at byte offset 32)",
        f"{tmp_path / 'bomb.yaml'}:8: aliases expand this document by more than "
        f"{MAX_ALIAS_NODES} nodes (at alias '*l4', of 36905 nodes)",
    ], result.stderr


def test_load_path_names_the_line_of_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_bytes(b"domain: d\ndescriptors:\n  - key: \xff\xfe\n")
    try:
        load_path(tmp_path / "p.yaml")
    except ConfigError as exc:
        assert exc.problems == [f"{tmp_path / 'p.yaml'}:3: not UTF-8 text (at byte offset 32)"]
    else:
        raise AssertionError("loaded a file that is not UTF-8")
