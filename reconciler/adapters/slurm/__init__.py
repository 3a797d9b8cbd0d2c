"""Slurm behind one interface, so the reconciler does not care how it talks to Slurm.

Two backends: `SlurmREST` (`rest.py`, over slurmrestd with a JWT: how Slinky's operator
reaches Slurm, the default) and `SlurmCLI` (`cli.py`, scontrol/squeue/scancel: for plain
Slurm clusters). `make_client` builds one from the reconciler's flags.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from gpufleet.reconciler.core import slurm_states
from gpufleet.reconciler.errors import PermanentError, TemporaryError


class SlurmError(RuntimeError):
    """A Slurm call failed. `temporary` says whether retrying may help (timeouts,
    slurmctld not answering) or not (unknown node, invalid request)."""

    def __init__(self, message: str, *, temporary: bool = False):
        super().__init__(message)
        self.temporary = temporary


@dataclass(frozen=True)
class SlurmNode:
    name: str
    # Base state and flags, upper-case, e.g. {"IDLE"}, {"MIXED", "DRAIN"}, {"DOWN", "NOT_RESPONDING"}
    # (reconciler/core/slurm_states.py says what they mean).
    states: frozenset[str]
    reason: str = ""
    # What Slinky's operator writes there: JSON {"namespace","podName","node","nodeSetName","nodeSetUID"}
    # ("node" being the Kubernetes node); "" when not a NodeSet pod's node.
    comment: str = ""
    partitions: tuple[str, ...] = ()
    last_busy: float | None = None  # epoch seconds of its last job (LastBusyTime); None when unknown
    # Who set `reason`, as Slurm records it (reconciler/core/slurm_reasons.py): a Slurm user's name; "" or digits
    # when Slurm could not name the uid; None when this backend did not say.
    reason_set_by: str | None = None
    reason_changed_at: float | None = None  # epoch seconds the reason was set; None when unknown

    @property
    def drained_or_down(self) -> bool:
        return slurm_states.drained_or_down(self.states)


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    state: str  # RUNNING, PENDING, COMPLETING, ...
    nodes: tuple[str, ...] = field(default_factory=tuple)
    requeue: bool = True  # whether the job may be requeued
    reason: str = ""      # pending reason, e.g. BeginTime
    restarts: int = 0     # how often Slurm has requeued it (SLURM_RESTART_COUNT)
    partitions: tuple[str, ...] = ()
    node_count: int = 1   # nodes it asks for (or holds)
    hold: bool = False    # held (priority 0) by a user or an admin
    # Read by the REST backend only (None/"" from the CLI one): the job's story (`gpufleet why`) and notes.
    admin_comment: str | None = None  # None: this backend did not read it (never overwrite what was not read)
    comment: str = ""     # the user's own comment (never written by gpufleet)
    user: str = ""
    account: str = ""
    submit_time: float | None = None  # epoch seconds
    start_time: float | None = None   # the latest start (after a requeue, the restart)
    end_time: float | None = None
    exit_code: str = ""   # e.g. "SUCCESS 0", "ERROR 1", "SIGNALED 9"


@dataclass(frozen=True)
class SlurmReservation:
    name: str
    nodes: tuple[str, ...] = ()  # Slurm node names, the hostlist expanded
    flags: frozenset[str] = frozenset()


class SlurmClient(Protocol):
    """What the reconciler needs from Slurm. Every call raises SlurmError on failure."""

    def node(self, name: str) -> SlurmNode: ...

    def nodes(self) -> list[SlurmNode]:
        """Every node slurmctld knows, sorted by name."""

    def jobs_on_node(self, name: str) -> list[SlurmJob]: ...

    def job(self, job_id: int) -> SlurmJob | None: ...

    def pending_jobs(self) -> list[SlurmJob]:
        """Jobs waiting in the queue, with the partitions they may run in and the nodes they ask for."""

    def running_jobs(self) -> list[SlurmJob]:
        """Jobs running now, with their nodes (one call: the telemetry pass judges them all)."""

    def jobs_failed_on(self, names: Sequence[str], since: float) -> list[SlurmJob]:
        """Jobs whose run on one of these nodes ended NODE_FAIL since `since` (epoch seconds), as accounting
        recorded them: slurmctld requeues a requeueable batch job off a node it marks DOWN and then forgets
        where it ran (src/slurmctld/job_mgr.c kill_running_job_by_node_ptr, batch_requeue_fini). Their nodes
        are that run's. Raises SlurmError where no accounting runs."""

    def drain(self, name: str, reason: str) -> None:
        """Nothing new is scheduled on the node; running jobs go on."""

    def signal_jobs(self, job_ids: Sequence[int], signal: str = "TERM") -> None:
        """Send a signal to the jobs (the batch script and its steps) so they can checkpoint."""

    def requeue(self, job_ids: Sequence[int]) -> None:
        """Put the jobs back in the queue (kills what still runs)."""

    def release(self, job_ids: Sequence[int]) -> None:
        """Make requeued jobs eligible now instead of after Slurm's requeue delay."""

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """Set the job's admin comment (the admin's field; the user's `comment` is left alone)."""

    def down(self, name: str, reason: str) -> None:
        """Set the node DOWN with `reason`: slurmctld kills or requeues what runs there and counts a job still
        completing there as done (slurm-26-05-3-1 src/slurmctld/job_mgr.c kill_running_job_by_node_ptr)."""

    def resume(self, name: str) -> None: ...

    def reservations(self) -> list[SlurmReservation]:
        """Every reservation slurmctld has, sorted by name."""

    def reserve_for_maintenance(self, name: str, nodes: Sequence[str], minutes: int) -> None:
        """A MAINT reservation `name` of `nodes`, from now for `minutes`, for this client's user; refused (a
        SlurmError) while a job runs on one of them (no IGNORE_JOBS): reconciler/core/active_checks.py."""

    def delete_reservation(self, name: str) -> None:
        """Delete the reservation; one that is not there (deleted, or ended) is no error."""


CLIENT_KINDS = ("rest", "cli", "none")


def call(fn: Callable, *args):
    """One Slurm call, its SlurmError as the reconciler's typed error (temporary or permanent)."""
    try:
        return fn(*args)
    except SlurmError as e:
        raise (TemporaryError if e.temporary else PermanentError)(f"Slurm: {e}") from None


def signal_targets(job_ids: Sequence[int], job: Callable[[int], "SlurmJob | None"]) -> tuple[list[int], list[int]]:
    """(jobs a signal can reach now, ids Slurm does not know), in the order given, each id once. A
    pending or ended job is skipped: nothing runs to be signalled (and scancel would retry a pending
    one for ~95 s). The states are slurm_states', so both backends and the core agree on them."""
    targets, unknown = [], []
    for jid in dict.fromkeys(int(j) for j in job_ids):
        found = job(jid)
        if found is None:
            unknown.append(jid)
        elif found.state in slurm_states.SIGNALLABLE_JOB_STATES:
            targets.append(jid)
    return targets, unknown


def make_client(kind: str, *, url: str | None = None, token_file: str | Path | None = None,
                token_secret: str | None = None, api=None,
                jwt_key_file: str | Path | None = None, user: str = "slurm",
                env: Mapping[str, str] | None = None, timeout: float = 10.0) -> SlurmClient | None:
    """The SlurmClient for the reconciler's `--slurm` flag: "rest" (slurmrestd at `url`, with
    the token in `token_file`, in the Secret `token_secret` (NAMESPACE/NAME[/KEY], read with the
    Kubernetes client `api`) or one signed from `jwt_key_file` for `user`), "cli" (Slurm's
    tools, with `env`) or "none". Bad combinations raise ValueError naming the flag."""
    if kind == "none":
        return None
    if kind == "cli":
        from gpufleet.reconciler.adapters.slurm.cli import SlurmCLI

        return SlurmCLI(env=env)
    if kind != "rest":
        raise ValueError(f"--slurm: unknown backend {kind!r} (one of {', '.join(CLIENT_KINDS)})")
    from gpufleet.reconciler.adapters.slurm.rest import SignedToken, SlurmREST, TokenFile, TokenSource

    if not url:
        raise ValueError("--slurm rest needs --slurm-url (slurmrestd, e.g. http://slurm-restapi.slurm:6820)")
    if sum(map(bool, (token_file, token_secret, jwt_key_file))) != 1:
        raise ValueError("--slurm rest needs exactly one of --slurm-token-secret (a Slinky Token's Secret, read "
                         "through the API server), --slurm-token-file (the same, mounted) and "
                         "--slurm-jwt-key-file (the cluster's JWT key: the local environment only)")
    tokens: TokenSource
    if token_secret:
        from gpufleet.reconciler.adapters.slurm.token_secret import SecretRef, SecretToken

        if api is None:
            raise ValueError("--slurm-token-secret needs a Kubernetes client")
        tokens = SecretToken(api, SecretRef.parse(token_secret))
    elif token_file:
        tokens = TokenFile(token_file)
    else:
        tokens = SignedToken(jwt_key_file, user=user)  # type: ignore[arg-type]
    return SlurmREST(url, tokens, timeout=timeout)
