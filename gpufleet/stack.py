"""Run the Pulumi CLI for one stack of this project, with the environment it needs.

The `local` stack runs against a local environment: its state backend and its generated stack
configuration (the tracked Pulumi.local.yaml plus what the environment supplies, such as the image
digests and the API address) are what that environment recorded (:mod:`gpufleet.local_cluster`), and its
secrets use a passphrase (default `gpufleet-local`, documented in docs/local.md; set
PULUMI_CONFIG_PASSPHRASE to use another). Any other stack needs PULUMI_BACKEND_URL: it never falls back
to a local file backend, where a prod `up` would start from an empty state.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from gpufleet import local_cluster
from gpufleet.local_cluster import LOCAL_PASSPHRASE
from gpufleet.paths import PROJECT_DIR, TOOLS_BIN

# The pulumi commands that read a stack's configuration (and so take --config-file).
CONFIG_COMMANDS = frozenset({"up", "preview", "destroy", "refresh", "config", "import", "watch"})


class PulumiError(RuntimeError):
    pass


class NoBackendError(PulumiError):
    """A stack other than `local` with no explicit backend."""


BACKEND_VAR = "PULUMI_BACKEND_URL"


def require_backend(stack: str, env: dict[str, str]) -> None:
    if stack == "local" and not env.get(BACKEND_VAR):
        raise NoBackendError(
            f"stack local has no state backend: no local environment is up (`gpufleet local up` records its "
            f"backend in the file {local_cluster.STATE_ENV} names)")
    if not env.get(BACKEND_VAR):
        raise NoBackendError(
            f"stack {stack} has no explicit state backend: set {BACKEND_VAR} (e.g. s3://<bucket>/gpufleet or "
            f"https://api.pulumi.com); gpufleet never uses the local file backend for a stack other than local, "
            f"where `up` would start from an empty state")


def pulumi_binary() -> str:
    built = TOOLS_BIN / "pulumi"
    if built.exists():
        return str(built)
    found = shutil.which("pulumi")
    if found:
        return found
    raise PulumiError("pulumi not found: run scripts/build-tools.sh (builds it into .tools/bin) or install it")


@dataclass
class Stack:
    name: str
    project_dir: Path = PROJECT_DIR
    extra_env: dict[str, str] = field(default_factory=dict)
    config_file: Path | None = None  # instead of Pulumi.<name>.yaml (for `local`: the environment's)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{TOOLS_BIN}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("PULUMI_SKIP_UPDATE_CHECK", "true")
        env.setdefault("PULUMI_DIY_BACKEND_NO_LEGACY_WARNING", "true")
        if (TOOLS_BIN.parent / "pulumi-home").exists():
            env.setdefault("PULUMI_HOME", str(TOOLS_BIN.parent / "pulumi-home"))
        env.update(self.extra_env)
        if self.name == "local":
            if BACKEND_VAR not in self.extra_env:  # local stays local: never another backend
                env.pop(BACKEND_VAR, None)
                cluster = local_cluster.find()
                if cluster is not None:
                    env[BACKEND_VAR] = cluster.pulumi_backend_url
            env.setdefault("PULUMI_CONFIG_PASSPHRASE", LOCAL_PASSPHRASE)
        require_backend(self.name, env)
        return env

    def stack_config_file(self) -> Path | None:
        """The configuration file pulumi reads for this stack: `config_file`, else for `local` the one the
        local environment generated; None: Pulumi.<name>.yaml."""
        if self.config_file is not None or self.name != "local" or BACKEND_VAR in self.extra_env:
            return self.config_file
        cluster = local_cluster.find()
        return cluster.pulumi_config_file if cluster is not None else None

    def config_args(self, args: Sequence[str]) -> list[str]:
        """`--config-file` for the commands that read the stack's configuration, when it is not the default."""
        cf = self.stack_config_file()
        return ["--config-file", str(cf)] if cf is not None and args and args[0] in CONFIG_COMMANDS else []

    def run(self, *args: str, capture: bool = False, check: bool = True, timeout: float | None = 1800,
            stack_flag: bool = True, stdin_text: str | None = None) -> subprocess.CompletedProcess:
        argv = [pulumi_binary(), *args, *self.config_args(args), "--cwd", str(self.project_dir), "--non-interactive"]
        if stack_flag:
            argv += ["--stack", self.name]
        feed = {"input": stdin_text} if stdin_text is not None else {"stdin": subprocess.DEVNULL}
        proc = subprocess.run(argv, env=self.env(), text=True, timeout=timeout, capture_output=capture, **feed)
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout or "")[-3000:] if capture else ""
            raise PulumiError(f"pulumi {' '.join(args)} failed (exit {proc.returncode}) {detail}".strip())
        return proc

    def exists(self) -> bool:
        out = self.run("stack", "ls", "--json", capture=True, stack_flag=False).stdout
        return any(s["name"] == self.name for s in json.loads(out or "[]"))

    def ensure(self) -> bool:
        """Create the stack when missing (its config file and salt are committed for `local`); True when
        it was created."""
        if self.exists():
            return False
        self.run("stack", "init", self.name, "--secrets-provider", "passphrase", stack_flag=False, capture=True)
        return True

    def ensure_secrets(self, keys: Sequence[str]) -> list[str]:
        """Set random values for missing secrets (the local stack only: demo values)."""
        cfg = json.loads(self.run("config", "--json", capture=True).stdout or "{}")
        missing = [k for k in keys if f"gpufleet:{k}" not in cfg]
        for k in missing:
            self.set_secret(k, secrets.token_urlsafe(32))
        return missing

    def set_secret(self, key: str, value: str) -> None:
        """`pulumi config set --secret KEY` with the value on stdin, as pulumi reads it when not on a
        terminal: a value on the command line would be read as a flag when it starts with `-` (a
        token_urlsafe does, one time in 64) and would show in the process table and in our errors."""
        self.run("config", "set", "--secret", key, capture=True, stdin_text=value)

    def up(self, *extra: str) -> subprocess.CompletedProcess:
        return self.run("up", "--yes", "--skip-preview", *extra)

    def preview(self, *extra: str, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("preview", *extra, capture=capture, check=check)

    def destroy(self) -> subprocess.CompletedProcess:
        return self.run("destroy", "--yes", "--skip-preview")

    def outputs(self) -> dict:
        return json.loads(self.run("stack", "output", "--json", "--show-secrets", capture=True).stdout or "{}")
