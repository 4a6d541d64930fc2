"""`eagle3` is one argparse tree: every command and its arguments are declared in app/cli.py, `--help`
answers without loading the pipeline's heavy libraries, and a wrong command or argument is exit code 2."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys

import pytest

from eagle3_dagster.app.cli import COMMAND_NAMES, build_parser, main
from eagle3_dagster.config import PROJECT_ROOT

HEAVY = ("dagster", "polars", "great_expectations", "transformers")

# What a fresh interpreter has loaded after building the tree and printing `eagle3 --help`.
PROBE = """
import contextlib, io, sys
from eagle3_dagster.app.cli import build_parser, main
build_parser()
built = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["--help"])
helped = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))
print(rc, built, helped)
"""


@pytest.mark.integration
def test_building_the_tree_and_help_import_no_heavy_library() -> None:
    r = subprocess.run(
        [sys.executable, "-c", PROBE, *HEAVY], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == "0 [] []"


def test_every_command_is_a_subparser_with_a_handler() -> None:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert (
        tuple(sub.choices)
        == COMMAND_NAMES
        == ("ingest", "render", "inspect", "report", "demo", "backfill", "ui", "plan", "check", "drafters")
    )
    args = parser.parse_args(["drafters", "compare", "--candidate", "http://c:30000", "--baseline", "eagle3-a"])
    assert (args.drafters_action, args.candidate, args.baseline, args.json, args.trained_on) == (
        "compare",
        "http://c:30000",
        "eagle3-a",
        None,
        None,
    )
    args = parser.parse_args(["plan", "--servers", "3"])
    assert args.command == "plan" and args.servers == 3 and args.gpus_per_server == 8 and callable(args.handler)
    args = parser.parse_args(["ingest", "x.jsonl", "--out", "o", "--field", "messages=dialog", "--format", "sharegpt"])
    assert (args.file, args.out, args.field, args.format, args.max_bytes) == (
        "x.jsonl",
        "o",
        ["messages=dialog"],
        "sharegpt",
        200_000,
    )


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_each_command_help_is_exit_0_and_names_its_flags(command: str, capsys) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: eagle3 {command}")
    flag = {"ingest": "--allow-empty", "render": "--max-new-tokens", "inspect": "--histograms", "report": "--work-dir"}
    flag |= {"demo": "--samples", "ui": "--port", "plan": "--tokens-per-s-per-server", "check": "--offline"}
    flag |= {"drafters": "compare"}
    flag |= {"backfill": "--allow-partial"}
    assert flag[command] in out


def test_the_ingest_layouts_are_listed_and_checked_from_the_ingest_stage(capsys) -> None:
    from eagle3_dagster.ingest.normalize import FORMAT_ALIASES, PROMPT_RULES

    assert main(["ingest", "--help"]) == 0
    out = capsys.readouterr().out
    assert "{" + ",".join(sorted(FORMAT_ALIASES)) + "}" in out and "{" + ",".join(PROMPT_RULES) + "}" in out
    assert main(["ingest", "x.jsonl", "--out", "o", "--format", "nonsense"]) == 2
    assert "argument --format: invalid choice: 'nonsense'" in capsys.readouterr().err


def test_no_command_prints_help_and_is_exit_2(capsys) -> None:
    assert main([]) == 2
    assert "usage: eagle3" in capsys.readouterr().out
    assert main(["help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMAND_NAMES)


def test_an_unknown_command_is_exit_2_naming_the_valid_ones(capsys) -> None:
    assert main(["frobnicate"]) == 2
    assert (
        capsys.readouterr().err.strip() == f"eagle3: unknown command 'frobnicate'; one of: {', '.join(COMMAND_NAMES)}"
    )


@pytest.mark.parametrize(
    "argv",
    [["ingest", "x.jsonl"], ["render", "in.jsonl"], ["inspect", "--shard", "x"], ["check", "--bogus"], ["--bogus"]],
)
def test_a_bad_argument_is_exit_2_with_the_usage_line(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: eagle3") and "error:" in err


def test_no_module_outside_the_tree_builds_its_own_eagle3_parser() -> None:
    """The tree is the only `eagle3` parser; the simulator (its own program) and the docs tool keep theirs."""
    own_programs = {"app/cli.py", "sim/cli.py", "devtools/docs_gen.py"}
    package = PROJECT_ROOT / "eagle3_dagster"
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "ArgumentParser" and rel not in own_programs:
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"argparse parsers outside app/cli.py: {found}"


def test_drafters_compare_needs_a_candidate(capsys) -> None:
    assert main(["drafters", "compare", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--candidate", "--baseline", "--json", "--trained-on", "--probe-seed"):
        assert flag in out
    assert main(["drafters", "compare"]) == 2
    assert "the following arguments are required: --candidate" in capsys.readouterr().err
