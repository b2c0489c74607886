"""The package installs, its extension loads and the CLI behaves."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "ditmem.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_imports_and_extension():
    import ditmem
    import ditmem._C
    import ditmem.ops
    import ditmem.scheduler

    assert ditmem._C.__file__.endswith(".so")
    assert pathlib.Path(ditmem.ops.__file__).parent == ROOT / "ops"
    assert pathlib.Path(ditmem.scheduler.__file__).parent == ROOT / "scheduler"


def test_help_lists_the_five_subcommands():
    res = run_cli("--help")
    assert res.returncode == 0
    for name in ("serve", "bench", "sim", "demo", "profile"):
        assert name in res.stdout


def test_unknown_subcommand_exits_2():
    res = run_cli("no-such-command")
    assert res.returncode == 2


def test_no_subcommand_prints_help_and_exits_2():
    res = run_cli()
    assert res.returncode == 2
    assert "usage" in res.stdout


def test_scheduler_imports_neither_torch_nor_other_ditmem_parts():
    for path in (ROOT / "scheduler").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top != "torch", f"{path} imports torch"
                if top == "ditmem":
                    assert name.startswith("ditmem.scheduler"), f"{path} imports {name}"
