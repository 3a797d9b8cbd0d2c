"""The documents (README.md, docs/*.md, bench/README.md) keep to what exists: every `gpufleet` command they
show, in a code block or inline, names commands and flags the CLI has; every repository file they name is
there (and every test they cite, `file.py::test_name`); every link leads to a file and a heading that exist;
no tracker numbers. A block marked `<!-- doc-test: run -->` just above it is run, each line as written
from the repository root, and exits as its `# exit N` comment says (0 when it says nothing); `# exit N: TEXT`
also wants TEXT in what it prints.

The README's local-environment block is run whole by tests/e2e/test_readme_local.py.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from gpufleet.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
RUN_MARK = "<!-- doc-test: run -->"
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
SHELLS = {"", "bash", "sh", "console", "shell"}


def _name(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


# --- commands ------------------------------------------------------------------------------------------

def code_blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, body, marked to run) of each fenced block."""
    return [(m.group(1), m.group(2), text[:m.start()].rstrip().endswith(RUN_MARK)) for m in FENCE.finditer(text)]


def command_lines(body: str) -> list[str]:
    """A shell block's command lines: continuations joined, a `$ ` prompt dropped; in a block with prompts,
    only the prompted lines (the rest is output)."""
    lines = body.replace("\\\n", " ").splitlines()
    if any(line.startswith("$ ") for line in lines):
        return [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def gpufleet_argvs(line: str) -> list[list[str]]:
    """The gpufleet invocations in a shell line (after pipes, `&&`, `;`, variable assignments)."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return []
    out, current = [], []
    for tok in [*tokens, "|"]:
        if tok in ("|", "||", "&&", ";", ">", "2>", ">>", "<"):
            while current and re.match(r"^[A-Z_][A-Z0-9_]*=", current[0]):
                current.pop(0)
            if current and Path(current[0]).name == "gpufleet":
                out.append(current[1:])
            current = []
        else:
            current.append(tok)
    return out


def inline_commands(text: str) -> list[str]:
    """`gpufleet ...` in inline code spans, outside fenced blocks."""
    prose = FENCE.sub("", text)
    # a command's first word is a lowercase command or a flag (`gpufleet <time>: ...` is a message's text)
    return [m.group(1) for m in re.finditer(r"`((?:\.venv/bin/)?gpufleet (?:[a-z][a-z-]*|-)[^`]*)`", prose)]


def check_argv(argv: list[str]) -> str | None:
    """Why the CLI would not take these subcommands and flags, or None. Arguments are not checked (the docs
    write placeholders such as NODE); every `--flag` and `-f` is."""
    cmd = typer.main.get_command(app)  # a group: its subcommands in `commands` (typer carries its own click)
    ctx_path = ["gpufleet"]
    args = list(argv)
    while hasattr(cmd, "commands") and args and not args[0].startswith("-"):
        sub = cmd.commands.get(args[0])
        if sub is None:
            return f"`{' '.join(ctx_path)}` has no command {args[0]!r}"
        cmd, ctx_path = sub, [*ctx_path, args.pop(0)]
    if cmd.context_settings.get("ignore_unknown_options"):
        return None  # passes its arguments on (`gpufleet pulumi`)
    opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    for tok in args:
        if tok == "--":
            break
        if tok.startswith("-") and tok != "-" and not re.match(r"^-\d", tok):
            name = tok.split("=", 1)[0]
            if name not in opts:
                return f"`{' '.join(ctx_path)}` has no option {name} (it has {sorted(opts)})"
    return None


def doc_commands(doc: Path) -> list[tuple[str, list[str]]]:
    text = doc.read_text()
    found = []
    for lang, body, _ in code_blocks(text):
        if lang in SHELLS:
            for line in command_lines(body):
                found += [(line, argv) for argv in gpufleet_argvs(line)]
    for span in inline_commands(text):
        found += [(span, argv) for argv in gpufleet_argvs(span.replace(" | ", " \\| ").replace("\\|", "|"))]
    return found


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_gpufleet_command_a_document_shows_exists_with_its_flags(doc):
    wrong = [f"{line!r}: {why}" for line, argv in doc_commands(doc) if (why := check_argv(argv))]
    assert not wrong, "\n".join(wrong)


def test_the_command_check_refuses_what_the_cli_lacks():
    assert check_argv(["validate", "--stack", "prod"]) is None
    assert check_argv(["why", "1", "--json"]) is None
    assert check_argv(["pulumi", "-s", "local", "up", "--yes"]) is None
    assert "no option --stak" in check_argv(["validate", "--stak", "prod"])
    assert "no command 'whyy'" in check_argv(["whyy", "1"])
    assert "no option --watch" in check_argv(["why", "1", "--watch"])
    assert gpufleet_argvs("journalctl -k -b | gpufleet classify-kmsg - --json") == [["classify-kmsg", "-", "--json"]]
    assert gpufleet_argvs("K=1 .venv/bin/gpufleet local up  # a comment --nope") == [["local", "up"]]


# --- commands marked to run ----------------------------------------------------------------------------

def runnable_lines() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for lang, body, marked in code_blocks(doc.read_text()):
            if marked:
                out += [(_name(doc), line) for line in command_lines(body)]
    return out


@pytest.mark.parametrize("where,line", runnable_lines(), ids=lambda v: v if "/" in v or ".md" in v else v[:60])
def test_a_marked_documents_commands_run_as_written(where, line, tmp_path):
    # Each line runs from a folder that mirrors the repository root, so what it writes stays out of the checkout.
    for entry in ROOT.iterdir():
        if entry.name not in (".git",):
            (tmp_path / entry.name).symlink_to(entry)
    expect = re.search(r"#\s*exit (\d+)\b(?::\s*(.*))?", line)
    code, text = (int(expect.group(1)), (expect.group(2) or "").strip()) if expect else (0, "")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == code, f"{where}: {line}\nexit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert text in " ".join((r.stdout + r.stderr).split()), f"{where}: {line}: no {text!r} in\n{r.stdout}{r.stderr}"


def test_some_commands_are_run():
    assert len(runnable_lines()) >= 3


# --- files, tests, links, tracker numbers --------------------------------------------------------------

TOP = {p.name for p in ROOT.iterdir() if p.name != ".git"}
PATH = re.compile(r"(?<![\w./:-])((?:\.github|\.ci|[A-Za-z_][\w-]*)/[\w./<>*{}-]*[\w>*}/])")
TEST_REF = re.compile(r"(?<![\w./-])((?:[\w-]+/)*test_\w+\.py)?::(test_\w+)")


def named_paths(text: str) -> list[str]:
    """Repository paths a document names: a first folder that is the repository's (an upstream path such
    as `pkg/kubelet/...` is not); `<placeholder>` and `*` match anything."""
    return [m.group(1) for m in PATH.finditer(text) if m.group(1).split("/")[0] in TOP]


def missing_paths(text: str) -> list[str]:
    return [p for p in named_paths(text) if not glob.glob(str(ROOT / re.sub(r"<[^>]*>", "*", p).rstrip("/")))]


def missing_tests(text: str) -> list[str]:
    """`file.py::test_name` and, after it on the same line, `::test_name` of that file: each test exists."""
    missing = []
    for line in text.splitlines():
        current = None
        for m in TEST_REF.finditer(line):
            if m.group(1):
                matches = [ROOT / m.group(1)] if "/" in m.group(1) else list((ROOT / "tests").rglob(m.group(1)))
                current = next((p for p in matches if p.exists()), None)
                if current is None:
                    missing.append(m.group(1))
                    continue
            if current is not None and not re.search(rf"^\s*(async )?def {m.group(2)}\(", current.read_text(), re.M):
                missing.append(f"{current.relative_to(ROOT)}::{m.group(2)}")
    return missing


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", FENCE.sub("", doc.read_text()), re.M)}


def broken_links(doc: Path) -> list[str]:
    broken = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", FENCE.sub("", doc.read_text())):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue  # a web page
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(target)
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_file_test_and_link_a_document_names_exists(doc):
    text = doc.read_text()
    assert not missing_paths(text), f"{_name(doc)} names files that do not exist: {missing_paths(text)}"
    assert not missing_tests(text), f"{_name(doc)} cites tests that do not exist: {missing_tests(text)}"
    assert not broken_links(doc), f"{_name(doc)} links to nothing: {broken_links(doc)}"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_no_tracker_numbers(doc):
    found = re.findall(r"\b[Ii]ssues? \d+|\(#\d+\)", doc.read_text())
    assert not found, f"{_name(doc)}: {found}"


def test_the_checks_find_what_is_missing():
    assert missing_paths("`reconciler/runtime/controller.py`, `reconciler/runtime/healing.py`, `pkg/kubelet/x.go`, "
                         "`policies/config/<env>.json`") == ["reconciler/runtime/controller.py"]
    assert missing_tests("`tests/unit/test_docs.py::test_no_tracker_numbers`, `::test_not_here`") == [
        "tests/unit/test_docs.py::test_not_here"]
    assert slug("Repair: replace first, repair after") == "repair-replace-first-repair-after"
    assert slug("`pools[].lending`") == "poolslending"


# --- every page on-call can get is explained ------------------------------------------------------------

def page_events() -> set[str]:
    """The event names of every page the reconciler can send (`Notify("...")` in the core, `Message("...")`
    in the runtime)."""
    found = set()
    for path in (ROOT / "reconciler").rglob("*.py"):
        found |= set(re.findall(r"\b(?:Notify|Message)\(\s*\"([a-z][a-z-]*)\"", path.read_text()))
    return found


def test_every_page_has_its_row_in_the_oncall_runbook():
    text = (ROOT / "docs" / "oncall.md").read_text()
    rows = set(re.findall(r"^\| `([a-z-]+)` \| (?:info|warning|critical) \|", text, re.M))
    assert {"detected", "storm", "failed", "slurm-token-stale"} <= page_events()
    missing = sorted(page_events() - rows)
    assert not missing, (f"pages with no row in docs/oncall.md's page table (what it means, what to do): {missing}")
    gone = sorted(rows - page_events())
    assert not gone, f"docs/oncall.md explains pages the reconciler no longer sends: {gone}"


def test_every_metric_and_alert_is_in_the_oncall_runbook():
    from prometheus_client import CollectorRegistry

    from gpufleet.components.alerts import alert_rules
    from gpufleet.reconciler.runtime.metrics import Metrics

    text = (ROOT / "docs" / "oncall.md").read_text()
    registry = CollectorRegistry()
    Metrics(registry)
    names = [f.name + ("_total" if f.type == "counter" else "") for f in registry.collect()]
    assert "gpufleet_remediations_total" in names
    missing = [n for n in names if f"| `{n}` |" not in text]
    assert not missing, f"metrics with no row in docs/oncall.md's metrics table: {missing}"
    alerts = [r["alert"] for r in alert_rules()]
    assert not [a for a in alerts if f"`{a}`" not in text], f"alerts docs/oncall.md does not name: {alerts}"


def test_the_readme_is_short_and_leads_to_every_document():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150, "README.md is for a first look: put the rest in the document of its audience"
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", text))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"documents the README does not lead to: {sorted(pages - linked)}"
