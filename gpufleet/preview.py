"""`gpufleet preview` and `gpufleet render`: what a change would do, fit for a pull request.

`preview` runs `pulumi preview --diff` with the policy pack (`policies/`) and the environment's
policy config (`policies/config/<env>.json`) through Pulumi's Automation API: its engine events
(steps, policy violations, diagnostics, the summary) come typed, and are kept as the event log's
JSON objects. The pure functions below turn those (or a `--json` digest) into a Summary:
changes by operation and kind, every policy violation with its level, and errors. Exit 1
when a mandatory policy fails or the preview itself fails; 2 for invalid input.

`--scratch` previews in a throwaway copy of the stack: empty state in a temporary file
backend, a random passphrase and placeholder secrets, so no backend or secret is needed
(everything shows as a create). `render` always works that way: it runs `pulumi up` with
GPUFLEET_RENDER_DIR set, so the Kubernetes provider writes manifests instead of applying them.
"""
from __future__ import annotations

import json
import re
import secrets as _secrets
import shutil
import subprocess
import tempfile
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import typer

from gpufleet.console import EXIT_FAILED, EXIT_INVALID, _err, app
from gpufleet.paths import PROJECT_DIR

POLICY_PACK_DIR = PROJECT_DIR / "policies"
POLICY_CONFIG_DIR = POLICY_PACK_DIR / "config"
PLACEHOLDER_SECRET = "placeholder-not-a-real-secret"

# Operations a reader cares about, in the order a summary lists them. The engine also emits
# create-replacement / delete-replaced around a replace: counted once, as the replace.
CHANGE_OPS = ("create", "update", "replace", "delete", "import")
_OP_ALIASES = {"create-replacement": None, "delete-replaced": None, "discard-replaced": None,
               "replace": "replace", "import-replacement": "replace", "discard": "delete",
               "remove-pending-replace": None}
_QUIET_OPS = {"same", "read", "refresh", "read-replacement", "read-discard"}
_COLOR = re.compile(r"<\{%[^%]*%\}>")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --- parsing ----------------------------------------------------------------------------------

def clean(text: str) -> str:
    """Drop the engine's colour directives (`<{%fg 1%}>`) and ANSI codes."""
    return _ANSI.sub("", _COLOR.sub("", text or ""))


def parse_digest(text: str) -> dict | None:
    """The `pulumi preview --json` document, or None (empty, or the preview died first)."""
    text = (text or "").strip()
    start = text.find("{")
    if start < 0:
        return None
    try:
        doc = json.loads(text[start:])
    except ValueError:
        try:  # trailing noise after the document
            doc, _ = json.JSONDecoder().raw_decode(text[start:])
        except ValueError:
            return None
    return doc if isinstance(doc, dict) else None


def parse_events(text: str) -> list[dict]:
    """An engine event log (`--event-log`): one JSON object per line; broken lines are skipped."""
    out = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


def split_urn(urn: str) -> tuple[str, str]:
    """'urn:pulumi:prod::gpufleet::a$b$kubernetes:apps/v1:Deployment::prod-reconciler-deployment'
    -> ('kubernetes:apps/v1:Deployment', 'prod-reconciler-deployment')"""
    parts = (urn or "").split("::")
    if len(parts) < 4:
        return "", urn or ""
    return parts[2].rsplit("$", 1)[-1], "::".join(parts[3:])


def kind_of(type_token: str) -> str:
    """'kubernetes:apps/v1:Deployment' -> 'Deployment'; 'pulumi:providers:kubernetes' -> 'provider:kubernetes'."""
    if type_token.startswith("pulumi:providers:"):
        return "provider:" + type_token.split(":", 2)[2]
    return type_token.rsplit(":", 1)[-1] if type_token else "?"


def _level(raw: str) -> str:
    raw = (raw or "").lower()
    if raw in ("mandatory", "remediate"):
        return "mandatory"
    if raw in ("advisory", "warning"):
        return "advisory"
    return raw or "advisory"


@dataclass
class Change:
    op: str
    kind: str
    name: str
    urn: str
    type: str
    diffs: list[str] = field(default_factory=list)


@dataclass
class Violation:
    policy: str
    level: str          # mandatory | advisory
    message: str        # the rule's message (what, on which resource, how to fix)
    urn: str = ""
    kind: str = ""
    name: str = ""
    pack: str = ""

    @property
    def where(self) -> str:
        return f"{self.kind} {self.name}" if self.urn else "stack"


@dataclass
class Summary:
    stack: str
    changes: list[Change] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    policy_packs: dict[str, str] = field(default_factory=dict)
    policy_config: str = ""
    mode: str = "stack state"
    unchanged: int = 0
    engine_exit: int | None = None

    @property
    def mandatory(self) -> list[Violation]:
        return [v for v in self.violations if v.level == "mandatory"]

    @property
    def advisory(self) -> list[Violation]:
        return [v for v in self.violations if v.level != "mandatory"]

    @property
    def failed(self) -> bool:
        return bool(self.mandatory or self.errors or (self.engine_exit not in (None, 0)))

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def counts(self) -> dict[str, Counter]:
        """op -> Counter(kind -> n), ops in CHANGE_OPS order."""
        by: dict[str, Counter] = defaultdict(Counter)
        for c in self.changes:
            by[c.op][c.kind] += 1
        return {op: by[op] for op in CHANGE_OPS if by.get(op)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "mode": self.mode,
            "ok": not self.failed,
            "changes": {op: dict(sorted(c.items())) for op, c in self.counts().items()},
            "unchanged": self.unchanged,
            "resources": [asdict(c) for c in self.changes],
            "violations": [asdict(v) for v in self.violations],
            "mandatory_violations": len(self.mandatory),
            "advisory_violations": len(self.advisory),
            "errors": self.errors,
            "warnings": self.warnings,
            "policy_packs": self.policy_packs,
            "policy_config": self.policy_config,
            "engine_exit": self.engine_exit,
        }


def _is_component(type_token: str, state: dict | None) -> bool:
    """Component resources (gpufleet's own and the stack) change nothing by themselves."""
    if isinstance(state, dict) and "custom" in state:
        return not state.get("custom")
    return type_token.startswith(("pulumi:pulumi:", "gpufleet:"))


def _change(op: str, urn: str, type_token: str, state: dict | None, diffs: Iterable[str] | None) -> Change | None:
    op = _OP_ALIASES.get(op, op)
    if op is None or op in _QUIET_OPS or not urn:
        return None
    t, name = split_urn(urn)
    type_token = type_token or t
    if _is_component(type_token, state):
        return None
    return Change(op, kind_of(type_token), name, urn, type_token, sorted(set(diffs or [])))


def _violation(pe: dict) -> Violation:
    urn = pe.get("resourceUrn") or ""
    t, name = split_urn(urn) if urn else ("", "")
    text = clean(pe.get("message", "")).strip()
    # The SDK sends "<policy description>\n<the rule's message>": keep the rule's message.
    detail = text.split("\n", 1)[1].strip() if "\n" in text else text
    return Violation(policy=pe.get("policyName", "?"), level=_level(pe.get("enforcementLevel", "")),
                     message=detail or text, urn=urn, kind=kind_of(t) if t else "", name=name,
                     pack=pe.get("policyPackName", ""))


def summarize(digest: dict | None, events: list[dict], *, stack: str, policy_config: str = "",
              mode: str = "stack state", engine_exit: int | None = None) -> Summary:
    """Steps from the digest (or, without one, from the event log's resourcePreEvents), policy
    violations and errors from the event log (and the digest's diagnostics)."""
    s = Summary(stack=stack, policy_config=policy_config, mode=mode, engine_exit=engine_exit)
    seen: set[tuple[str, str]] = set()

    def add(c: Change | None) -> None:
        if c is not None and (c.op, c.urn) not in seen:
            seen.add((c.op, c.urn))
            s.changes.append(c)

    steps = (digest or {}).get("steps") or []
    metas = [m for m in ((ev.get("resourcePreEvent") or {}).get("metadata") for ev in events) if m]
    # Replacement keys sit on the create-replacement step; the summary shows them on the replace.
    replace_keys: dict[str, list[str]] = defaultdict(list)
    for st in steps:
        replace_keys[st.get("urn", "")] += st.get("replaceReasons") or []
    for m in metas:
        replace_keys[m.get("urn", "")] += m.get("keys") or []
    for st in steps:
        state = st.get("newState") or st.get("oldState") or {}
        add(_change(st.get("op", ""), st.get("urn", ""), state.get("type", ""), state,
                    st.get("diffReasons") or list(st.get("detailedDiff") or {}) or replace_keys.get(st.get("urn", ""))))
    if not steps:
        for m in metas:
            state = m.get("new") or m.get("old") or {}
            add(_change(m.get("op", ""), m.get("urn", ""), m.get("type", ""), state,
                        m.get("diffs") or list(m.get("detailedDiff") or {}) or replace_keys.get(m.get("urn", ""))))

    same = sum(1 for st in steps if st.get("op") == "same") or sum(1 for m in metas if m.get("op") == "same"
                                                                   and not _is_component(m.get("type", ""), m.get("new")))
    change_summary = (digest or {}).get("changeSummary") or {}
    s.unchanged = same or int(change_summary.get("same", 0) or 0)  # the engine's count includes components

    vkeys: set[tuple] = set()
    diag_msgs: list[tuple[str, str, str]] = []
    for ev in events:
        pe = ev.get("policyEvent")
        if pe:
            v = _violation(pe)
            key = (v.policy, v.urn, v.message)
            if key not in vkeys:
                vkeys.add(key)
                s.violations.append(v)
        de = ev.get("diagnosticEvent")
        if de and not de.get("ephemeral"):
            diag_msgs.append((de.get("severity", ""), de.get("urn", ""), clean(de.get("message", ""))))
        se = ev.get("summaryEvent")
        if se:
            # keys look like "gpufleet|local|/path/to/policies" (name|source|path)
            s.policy_packs.update({k.split("|", 1)[0]: v for k, v in (se.get("PolicyPacks") or {}).items()})
            if not s.unchanged:
                s.unchanged = int((se.get("resourceChanges") or {}).get("same", 0) or 0)
    for d in (digest or {}).get("diagnostics") or []:
        diag_msgs.append((d.get("severity", ""), d.get("urn", ""), clean(d.get("message", ""))))

    seen_msgs: set[str] = set()
    generic = []
    for sev, urn, msg in diag_msgs:
        msg = msg.strip()
        if not msg or msg in seen_msgs:
            continue
        seen_msgs.add(msg)
        if _is_policy_echo(msg):
            continue
        where = f"{kind_of(split_urn(urn)[0])} {split_urn(urn)[1]}: " if urn else ""
        if sev == "error" and _GENERIC_FAILURE.match(msg):
            generic.append(msg)  # "preview failed": kept only when nothing else says why
        elif sev == "error":
            s.errors.append(where + msg)
        elif sev == "warning":
            s.warnings.append(where + msg)
    if generic and not s.errors and not s.mandatory:
        s.errors.append(generic[0])
    return s


_NOISE = re.compile(r"^(warning: )?using pulumi-[a-z-]+ from \$PATH")
_GENERIC_FAILURE = re.compile(r"^(error: )?(preview|update) failed\s*$")


def _is_policy_echo(msg: str) -> bool:
    """Diagnostics that repeat what the summary already says: policy results echoed by the
    engine, and the note that a plugin came from $PATH (this project builds its own)."""
    low = msg.lower()
    return "policy violation" in low or low.startswith(("mandatory:", "advisory:")) or bool(_NOISE.match(msg))


# --- rendering --------------------------------------------------------------------------------

def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(s: Summary) -> str:
    icon = "❌" if s.failed else "✅"
    head = f"### {icon} `gpufleet preview --stack {s.stack}`"
    lines = [head, ""]
    counts = s.counts()
    if counts:
        lines += ["| change | count | kinds |", "| --- | ---: | --- |"]
        for op, c in counts.items():
            kinds = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in sorted(c.items()))
            lines.append(f"| {op} | {sum(c.values())} | {kinds} |")
        if s.unchanged:
            lines.append(f"| unchanged | {s.unchanged} | |")
    else:
        lines.append(f"No resource changes ({s.unchanged} unchanged)." if s.unchanged else "No resource changes.")
    lines.append("")
    if s.violations:
        lines += [f"**Policy violations:** {len(s.mandatory)} mandatory, {len(s.advisory)} advisory", "",
                  "| level | policy | resource | what and how to fix |", "| --- | --- | --- | --- |"]
        for v in sorted(s.violations, key=lambda v: (v.level != "mandatory", v.policy, v.name)):
            mark = "🚫 mandatory" if v.level == "mandatory" else "⚠️ advisory"
            lines.append(f"| {mark} | `{v.policy}` | {_md_escape(v.where)} | {_md_escape(v.message)} |")
    else:
        lines.append("**Policies:** all passed." if s.policy_packs or s.engine_exit == 0 else "**Policies:** no violations reported.")
    if s.errors:
        lines += ["", "**Errors:**", ""] + [f"- {_md_escape(e)}" for e in s.errors]
    if s.warnings:
        lines += ["", "<details><summary>Warnings</summary>", ""] + [f"- {_md_escape(w)}" for w in s.warnings] \
            + ["", "</details>"]
    if s.changes:
        lines += ["", "<details><summary>Resources</summary>", "", "| change | kind | name |", "| --- | --- | --- |"]
        for c in sorted(s.changes, key=lambda c: (CHANGE_OPS.index(c.op) if c.op in CHANGE_OPS else 99, c.kind, c.name)):
            shown = [f"`{d}`" for d in c.diffs[:4]] + (["…"] if len(c.diffs) > 4 else [])
            detail = f" ({', '.join(shown)})" if shown else ""
            lines.append(f"| {c.op} | {c.kind} | `{c.name}`{_md_escape(detail)} |")
        lines += ["", "</details>"]
    foot = [f"state: {s.mode}"]
    if s.policy_config:
        foot.append(f"policy config: `{s.policy_config}`")
    if s.policy_packs:
        foot.append("packs: " + ", ".join(f"{k} {v}" for k, v in s.policy_packs.items()))
    lines += ["", "<sub>" + " · ".join(foot) + "</sub>", ""]
    return "\n".join(lines)


def to_text(s: Summary) -> str:
    out = [f"preview of stack {s.stack} ({s.mode}):"]
    counts = s.counts()
    if counts:
        for op, c in counts.items():
            out.append(f"  {op:8} {sum(c.values()):4}  " + ", ".join(f"{k} {n}" for k, n in sorted(c.items())))
    else:
        out.append("  no resource changes")
    if s.unchanged:
        out.append(f"  {'same':8} {s.unchanged:4}")
    if s.violations:
        out.append(f"policy violations: {len(s.mandatory)} mandatory, {len(s.advisory)} advisory")
        for v in sorted(s.violations, key=lambda v: (v.level != "mandatory", v.policy, v.name)):
            out.append(f"  [{v.level}] {v.policy}: {v.message}")
    else:
        out.append("policy violations: none")
    for e in s.errors:
        out.append(f"error: {e}")
    out.append("result: " + ("FAILED" if s.failed else "ok"))
    return "\n".join(out)


# --- running the engine -----------------------------------------------------------------------

def default_policy_config(stack: str) -> Path | None:
    f = POLICY_CONFIG_DIR / f"{stack}.json"
    return f if f.exists() else None


def _plain_config(stack_yaml: Path) -> dict:
    """The stack file's config without secure values (they belong to another passphrase)."""
    import yaml

    doc = yaml.safe_load(stack_yaml.read_text()) or {}
    return {k: v for k, v in (doc.get("config") or {}).items() if not (isinstance(v, dict) and "secure" in v)}


@contextmanager
def scratch_stack(stack: str, secret_keys: list[str], extra_env: dict[str, str] | None = None,
                  stack_yaml: Path | None = None, secret_values: dict[str, str] | None = None) -> Iterator[Any]:
    """A throwaway copy of the project for one stack: the sources linked, the stack file's plain
    config copied, empty state in a temporary file backend, placeholder secrets (`secret_values` by key,
    else PLACEHOLDER_SECRET)."""
    import yaml

    from gpufleet.stack import Stack

    tmp = Path(tempfile.mkdtemp(prefix=f"gpufleet-{stack}-"))
    try:
        proj = tmp / "project"
        proj.mkdir()
        for entry in PROJECT_DIR.iterdir():
            if entry.name.startswith("Pulumi.") and entry.name != "Pulumi.yaml":
                continue
            if entry.name in (".git", ".local", ".pytest_cache", "rendered"):
                continue
            (proj / entry.name).symlink_to(entry)
        (proj / f"Pulumi.{stack}.yaml").write_text(
            yaml.safe_dump({"config": _plain_config(stack_yaml or PROJECT_DIR / f"Pulumi.{stack}.yaml")},
                           sort_keys=False))
        (tmp / "state").mkdir()
        env = {"PULUMI_BACKEND_URL": f"file://{tmp / 'state'}",
               "PULUMI_CONFIG_PASSPHRASE": _secrets.token_urlsafe(24),
               **(extra_env or {})}
        env.pop("PULUMI_CONFIG_PASSPHRASE_FILE", None)
        st = Stack(stack, project_dir=proj, extra_env=env)
        st.run("stack", "init", stack, "--secrets-provider", "passphrase", stack_flag=False, capture=True)
        for k in secret_keys:
            st.set_secret(k, (secret_values or {}).get(k, PLACEHOLDER_SECRET))
        yield st
    finally:
        shutil.rmtree(tmp, ignore_errors=True)




@dataclass
class EngineRun:
    """What one engine run left: its exit code, its text output, and its events as the event log's
    JSON objects (what `summarize` reads)."""

    returncode: int
    stdout: str = ""
    stderr: str = ""
    events: list[dict] = field(default_factory=list)


def _state(st: Any) -> dict | None:
    return None if st is None else {"type": st.type, "custom": st.custom}


def event_dict(ev: Any) -> dict:
    """A typed Automation API engine event as the engine's event-log JSON."""
    out: dict[str, Any] = {"sequence": ev.sequence}
    if ev.resource_pre_event is not None:
        m = ev.resource_pre_event.metadata
        out["resourcePreEvent"] = {"metadata": {
            "op": getattr(m.op, "value", m.op), "urn": m.urn, "type": m.type, "old": _state(m.old),
            "new": _state(m.new), "keys": list(m.keys or []), "diffs": list(m.diffs or []),
            "detailedDiff": {k: {} for k in (m.detailed_diff or {})}}, "planning": ev.resource_pre_event.planning}
    if ev.policy_event is not None:
        p = ev.policy_event
        out["policyEvent"] = {"policyName": p.policy_name, "enforcementLevel": p.enforcement_level,
                              "message": p.message, "resourceUrn": p.resource_urn or "",
                              "policyPackName": p.policy_pack_name}
    if ev.diagnostic_event is not None:
        d = ev.diagnostic_event
        out["diagnosticEvent"] = {"severity": d.severity, "urn": d.urn or "", "message": d.message,
                                  "ephemeral": bool(d.ephemeral)}
    if ev.summary_event is not None:
        se = ev.summary_event
        out["summaryEvent"] = {"PolicyPacks": dict(se.policy_packs or {}),
                               "resourceChanges": {getattr(k, "value", k): v for k, v in (se.resource_changes or {}).items()}}
    return out


def automation_stack(st: Any) -> Any:
    """The stack through Pulumi's Automation API, with gpufleet's environment (built tools,
    PULUMI_HOME, the backend) and the pulumi binary the project uses."""
    from pulumi import automation as auto

    from gpufleet.stack import pulumi_binary

    env = st.env()
    command = auto.PulumiCommand(root=str(Path(pulumi_binary()).resolve().parent.parent), skip_version_check=True)
    workspace = auto.LocalWorkspace(work_dir=str(st.project_dir), pulumi_home=env.get("PULUMI_HOME"),
                                    env_vars=env, pulumi_command=command)
    return auto.Stack.select(st.name, workspace)


def run_preview(st: Any, policy_config: Path | None, timeout: float = 3600) -> tuple[EngineRun, None, list[dict]]:
    """`pulumi preview --diff` with the policy pack, through the Automation API: its typed engine
    events (policy events included) feed the summary; nothing parses the CLI's text."""
    from pulumi.automation import errors as auto_errors

    events: list[dict] = []
    out: list[str] = []
    stack = automation_stack(st)
    try:
        config_file = st.stack_config_file()
        res = stack.preview(diff=True, color="never", policy_packs=[str(POLICY_PACK_DIR)],
                            config_file=str(config_file) if config_file is not None else None,
                            policy_pack_configs=[str(policy_config.resolve())] if policy_config is not None else None,
                            on_event=lambda ev: events.append(event_dict(ev)), on_output=out.append)
        run = EngineRun(0, res.stdout, res.stderr, events)
    except auto_errors.CommandError as e:
        code = re.search(r"code: (-?\d+)", str(e))
        stderr = str(e).split("stderr:", 1)[-1]
        run = EngineRun(int(code.group(1)) if code else 1, "\n".join(out), stderr, events)
    return run, None, events


def _write(path: Optional[Path], text: str) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@app.command()
def preview(
    stack: str = typer.Option(..., "--stack", "-s", help="The environment: Pulumi.<STACK>.yaml."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Write the Markdown summary (a PR comment) here."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the summary as JSON here."),
    policy_config: Optional[Path] = typer.Option(
        None, "--policy-config", help="Policy pack config; default policies/config/<STACK>.json when it exists."),
    scratch: bool = typer.Option(
        False, "--scratch", help="Preview against empty throwaway state with placeholder secrets (no backend or "
                                 "secrets needed; every resource shows as a create)."),
    stack_yaml: Optional[Path] = typer.Option(
        None, "--stack-file", help="With --scratch: preview this stack file instead of Pulumi.<STACK>.yaml (a what-if)."),
    raw: Optional[Path] = typer.Option(None, "--raw", help="Also keep pulumi's raw JSON output here (a folder)."),
    operator_chart: bool = typer.Option(
        True, "--operator-chart/--without-operator-chart",
        help="With --scratch and operator.mode helm: leave the Slinky operator's charts out of the preview "
             "(for machines that cannot fetch them); the summary says so."),
) -> None:
    """Preview a stack with the policy pack; print changes by kind and every policy violation.
    Exit 1 when a mandatory policy fails or the preview fails."""
    from gpufleet.fleetspec import SpecError, load_stack_file, stack_file

    from gpufleet.stack import PulumiError, Stack

    if stack_yaml is not None and not scratch:
        _err("--stack-file needs --scratch (a stack's real state belongs to its own stack file)")
        raise typer.Exit(EXIT_INVALID)
    if not operator_chart and not scratch:
        _err("--without-operator-chart needs --scratch (a stack's real state holds its charts)")
        raise typer.Exit(EXIT_INVALID)
    try:
        sf = load_stack_file(stack_yaml or stack_file(stack, PROJECT_DIR))
    except SpecError as e:
        _err(str(e))
        raise typer.Exit(EXIT_INVALID)
    if policy_config is None:
        policy_config = default_policy_config(stack)
    elif not policy_config.exists():
        _err(f"no such policy config: {policy_config}")
        raise typer.Exit(EXIT_INVALID)
    if not scratch:
        from gpufleet.stack import NoBackendError

        try:
            Stack(stack).env()
        except NoBackendError as e:
            _err(f"{e}; or preview with --scratch (empty throwaway state)")
            raise typer.Exit(EXIT_INVALID)
    if not scratch and sf.missing_secrets():
        _err(f"stack {stack} has no value for secret(s) {sf.missing_secrets()}, so its program refuses to run: set "
             f"them (`pulumi config set --secret KEY ...`) or preview with --scratch (placeholder secrets)")
        raise typer.Exit(EXIT_INVALID)

    try:
        chart_left_out = not operator_chart and sf.fleet.slurm.operator.mode == "helm"
        if scratch:
            extra = {"GPUFLEET_WITHOUT_OPERATOR_CHART": "1"} if chart_left_out else None
            with scratch_stack(stack, sf.fleet.secret_keys(), extra, stack_yaml=stack_yaml) as st:
                proc, digest, events = run_preview(st, policy_config)
        else:
            st = Stack(stack)
            if not st.exists():
                _err(f"stack {stack} does not exist in backend {st.env().get('PULUMI_BACKEND_URL', '(default)')}: "
                     f"log in to the right backend (PULUMI_BACKEND_URL), or preview with --scratch")
                raise typer.Exit(EXIT_INVALID)
            proc, digest, events = run_preview(st, policy_config)
    except (PulumiError, subprocess.TimeoutExpired, FileNotFoundError) as e:
        _err(f"preview of stack {stack} could not run: {e}")
        raise typer.Exit(EXIT_FAILED)

    if raw is not None:
        raw.mkdir(parents=True, exist_ok=True)
        (raw / f"{stack}.preview.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        (raw / f"{stack}.stdout.txt").write_text(proc.stdout or "")
        (raw / f"{stack}.stderr.txt").write_text(proc.stderr or "")

    rel = str(policy_config.resolve().relative_to(PROJECT_DIR)) if policy_config and \
        policy_config.resolve().is_relative_to(PROJECT_DIR) else str(policy_config or "")
    s = summarize(digest, events, stack=stack, policy_config=rel,
                  mode="scratch: empty state, placeholder secrets" if scratch else "stack state",
                  engine_exit=proc.returncode)
    if chart_left_out:
        s.warnings.append("the Slinky operator's charts are left out of this preview (--without-operator-chart)")
    if proc.returncode != 0 and not s.errors and not s.mandatory:
        tail = clean(proc.stderr or "").strip().splitlines()[-5:]
        s.errors.append("pulumi preview failed (exit %d)%s" % (proc.returncode, (": " + " | ".join(tail)) if tail else ""))
    typer.echo(to_text(s))
    _write(markdown, to_markdown(s))
    _write(json_out, json.dumps(s.to_dict(), indent=2) + "\n")
    if s.failed:
        raise typer.Exit(EXIT_FAILED)


# --- render ------------------------------------------------------------------------------------

RENDER_SUBDIRS = ("0-crd", "1-manifest")


def rendered_files(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.is_file())


def render_placeholders(secret_keys: Iterable[str]) -> dict[str, str]:
    """A value per secret config key for a render: unique and random, so each one found in a manifest names the
    key it came from, and none can be mistaken for (or used as) a real secret."""
    return {k: f"gpufleet-render-placeholder-{k}-{_secrets.token_hex(8)}" for k in secret_keys}


@dataclass
class SecretsFound:
    """What the placeholders of a render reached: Secrets (left out: the platform provides them) and any
    other manifest (a leak: the render is refused)."""

    secrets: list[tuple[Path, str, dict[str, str]]] = field(default_factory=list)  # file, ns/name, key -> config key
    leaks: list[tuple[Path, list[str]]] = field(default_factory=list)              # file, config keys


def _decoded(value: Any) -> str:
    import base64
    import binascii

    try:
        return base64.b64decode(str(value), validate=True).decode(errors="replace")
    except (binascii.Error, ValueError):
        return str(value)


def _base64_forms(value: str) -> list[str]:
    """The three strings one of which the base64 of any text holding `value` holds (one per alignment)."""
    import base64

    out = []
    for pad in range(3):
        enc = base64.b64encode(b"\0" * pad + value.encode()).decode()
        out.append(enc[4 if pad else 0:-4])
    return out


def find_secret_values(files: Iterable[Path], placeholders: dict[str, str]) -> SecretsFound:
    """Which rendered manifests hold a placeholder, plainly, base64-encoded (a Secret's `data`) or in any
    other form a manifest's text shows."""
    import yaml

    found = SecretsFound()
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        try:
            docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
        except yaml.YAMLError:
            docs = []
        if len(docs) == 1 and docs[0].get("kind") == "Secret":
            d = docs[0]
            values = {k: _decoded(v) for k, v in (d.get("data") or {}).items()}
            values.update({k: str(v) for k, v in (d.get("stringData") or {}).items()})
            held = {k: key for k, v in values.items() for key, ph in placeholders.items() if ph in v}
            if held:
                meta = d.get("metadata") or {}
                found.secrets.append((f, f"{meta.get('namespace', '')}/{meta.get('name', '')}".lstrip("/"), held))
                continue
        keys = sorted(k for k, ph in placeholders.items() if ph in text or any(b in text for b in _base64_forms(ph)))
        if keys:
            found.leaks.append((f, keys))
    return found


def secrets_required_text(stack: str, found: SecretsFound) -> str:
    """SECRETS-REQUIRED.md: the Secrets a render left out, and the stack config key behind each of their keys."""
    lines = [f"# Secrets `gpufleet render --stack {stack}` left out", "",
             "Create each of these before the manifests are applied (an External Secrets, Sealed Secrets or "
             "SOPS resource from your secret manager), with these keys:", ""]
    for _, name, held in sorted(found.secrets, key=lambda x: x[1]):
        keys = ", ".join(f"`{k}` (stack secret `{c}`)" for k, c in sorted(held.items()))
        lines.append(f"- Secret `{name}`: {keys}")
    return "\n".join(lines) + "\n"


@app.command()
def render(
    stack: str = typer.Option(..., "--stack", "-s", help="The environment: Pulumi.<STACK>.yaml."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the manifests (GitOps)."),
    force: bool = typer.Option(False, "--force", help="Replace manifests a previous render left in --out."),
    policies: bool = typer.Option(True, "--policies/--no-policies",
                                  help="Enforce the policy pack (the env's policies/config/<STACK>.json) while rendering."),
    operator_chart: bool = typer.Option(
        True, "--operator-chart/--without-operator-chart",
        help="With operator.mode helm: render the Slinky operator's charts too (they must be fetchable), or leave "
             "them out and write the values to install them with (slurm-operator-values.yaml)."),
) -> None:
    """Write the stack's Kubernetes manifests to a folder instead of applying them.

    Runs the program with GPUFLEET_RENDER_DIR (the provider's renderYamlToDirectory) through
    `pulumi up` on a throwaway stack: empty state, a random placeholder for each secret, the policy pack
    enforced. No secret value is written: the Secrets that would hold one are left out and named in
    SECRETS-REQUIRED.md (your secret manager provides them); a placeholder found in any other manifest
    refuses the render (exit 1)."""
    from gpufleet.fleetspec import SpecError, load_stack_file, stack_file

    from gpufleet.stack import PulumiError

    try:
        sf = load_stack_file(stack_file(stack, PROJECT_DIR))
    except SpecError as e:
        _err(str(e))
        raise typer.Exit(EXIT_INVALID)
    out = out.resolve()
    existing = [out / d for d in RENDER_SUBDIRS if (out / d).exists()]
    if existing and not force:
        _err(f"{out} already holds rendered manifests ({', '.join(d.name for d in existing)}): pass --force to "
             f"replace them")
        raise typer.Exit(EXIT_INVALID)
    for d in existing:
        shutil.rmtree(d)
    if existing:
        (out / "slurm-operator-values.yaml").unlink(missing_ok=True)  # a previous render's, if it left the chart out
    out.mkdir(parents=True, exist_ok=True)
    env = {"GPUFLEET_RENDER_DIR": str(out)}
    chart_left_out = not operator_chart and sf.fleet.slurm.operator.mode == "helm"
    if chart_left_out:
        env["GPUFLEET_WITHOUT_OPERATOR_CHART"] = "1"
    try:
        placeholders = render_placeholders(sf.fleet.secret_keys())
        with scratch_stack(stack, sf.fleet.secret_keys(), env, secret_values=placeholders) as st:
            args = ["up", "--yes", "--skip-preview", "--color", "never"]
            if policies:
                args += ["--policy-pack", str(POLICY_PACK_DIR)]
                config = default_policy_config(stack)
                if config is not None:
                    args += ["--policy-pack-config", str(config)]
            proc = st.run(*args, capture=True, check=False, timeout=3600)
    except (PulumiError, subprocess.TimeoutExpired, FileNotFoundError) as e:
        _err(f"render of stack {stack} could not run: {e}")
        raise typer.Exit(EXIT_FAILED)
    files = rendered_files(out)
    if proc.returncode != 0:
        lines = clean((proc.stdout or "") + "\n" + (proc.stderr or "")).strip().splitlines()
        errors = [ln.strip() for ln in lines if re.search(r"\berror\b", ln, re.I)]
        tail = "\n".join(errors[:10] or lines[-15:])
        _err(f"pulumi up (render) for stack {stack} failed (exit {proc.returncode}); {len(files)} file(s) written "
             f"before it stopped:\n{tail}")
        raise typer.Exit(EXIT_FAILED)
    if chart_left_out:
        import yaml

        from gpufleet.components.slinky import operator_values

        op = sf.fleet.slurm.operator
        values = out / "slurm-operator-values.yaml"
        values.write_text(yaml.safe_dump(operator_values(sf.fleet), sort_keys=False))
        files = rendered_files(out)
        typer.secho(f"note: the Slinky operator's charts are left out of this render: install "
                    f"{op.repository}/slurm-operator-crds and {op.repository}/slurm-operator {op.chart_version} in "
                    f"namespace {sf.fleet.slurm.namespace} with {values.name}", fg=typer.colors.YELLOW, err=True)
    found = find_secret_values(files, placeholders)
    for f, _, _ in found.secrets:
        f.unlink()  # a Secret with a value: the platform's secret manager provides it
    if found.leaks:
        for f, _ in found.leaks:
            f.unlink()
        _err(f"refusing the render of stack {stack}: a secret reached manifests that are not Secrets, so they were "
             f"removed and the output is incomplete: "
             + "; ".join(f"{f.relative_to(out)} (from {', '.join(keys)})" for f, keys in found.leaks))
        raise typer.Exit(EXIT_FAILED)
    files = rendered_files(out)
    if found.secrets:
        (out / "SECRETS-REQUIRED.md").write_text(secrets_required_text(stack, found))
        files = rendered_files(out)
    typer.echo(f"rendered stack {stack}: {len(files)} file(s) in {out}")
    for f in files:
        typer.echo(f"  {f.relative_to(out)}")
    if found.secrets:
        typer.secho(f"note: {len(found.secrets)} Secret(s) hold secret values and are left out of the render; "
                    f"provide them before applying (SECRETS-REQUIRED.md): "
                    + ", ".join(name for _, name, _ in sorted(found.secrets, key=lambda x: x[1])),
                    fg=typer.colors.YELLOW, err=True)
    if not files:
        _err("nothing was rendered")
        raise typer.Exit(EXIT_FAILED)


__all__ = ["Summary", "Violation", "Change", "parse_digest", "parse_events", "summarize", "to_markdown", "to_text",
           "split_urn", "kind_of", "preview", "render"]
