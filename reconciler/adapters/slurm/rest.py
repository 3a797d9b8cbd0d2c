"""SlurmClient over slurmrestd: the path Slinky's operator takes to Slurm.

Data parser: at first use the client reads ``GET /openapi/v3`` and takes the newest data
parser it knows (:data:`KNOWN_PARSERS`, v0.0.45 then v0.0.44) that the server offers; a
server with neither is a permanent error naming what it offers.

Requeue: v0.0.45 (Slurm 26.05) has ``GET /slurm/v0.0.45/job/{id}/requeue``, used per job.
v0.0.44 (Slurm 25.11) has no requeue at all; there the client does what Slurm itself does
for a failed node: it sets one node of the job that is already drained (the faulted
node, drained earlier in the remediation) DOWN, keeping that node's reason, and Slurm
requeues every requeueable job on it. A job with no drained node is refused (permanent
error) rather than taking a healthy node down.

Tokens (``X-SLURM-USER-TOKEN``): :class:`TokenFile` reads the token that a Slinky ``Token``
resource keeps refreshed in a Secret mounted as a file (token_secret.SecretToken reads that Secret
through the API server; both are a :class:`KeptToken`); :class:`SignedToken` signs its own
HS256 JWT (claim ``sun``) from the mounted JWT key, as the operator does. Both are renewed a
minute before expiry, and once on a rejected token. slurmrestd answers an expired token
and one signed with another key alike (HTTP 401/511, Slurm error 1007), so the client
tells them apart by the token's own ``exp``: still expired after a re-read is temporary
(the Token controller has not refreshed it yet), a rejected token that has not expired is
permanent (wrong key or unknown user).

Errors: every failure is a :class:`~gpufleet.reconciler.adapters.slurm.SlurmError` naming Slurm, the call and
what came back. Temporary: slurmrestd unreachable or slow (httpx timeouts), HTTP 502-504,
Slurm errors that mean slurmctld did not answer; permanent: anything else (unknown node,
invalid request, permission denied).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence
from urllib.parse import urlencode

import httpx
import jwt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.reconciler.adapters.slurm import SlurmError, SlurmJob, SlurmNode, SlurmReservation, signal_targets
from gpufleet.reconciler.adapters.slurm.cli import expand_hostlist
from gpufleet.reconciler.core.slurm_states import ON_NODE_JOB_STATES, PENDING
from gpufleet.reconciler.core.slurm_token import assess

__all__ = ["KNOWN_PARSERS", "KeptToken", "SignedToken", "SlurmREST", "TokenFile", "TokenSource"]

log = logging.getLogger(__name__)

# Data parsers this client speaks, newest first.
KNOWN_PARSERS = ("v0.0.45", "v0.0.44")
TOKEN_HEADER = "X-SLURM-USER-TOKEN"
# Renew a token this long before it expires.
RENEW_BEFORE_S = 60
RECHECK_STALE_S = 30.0  # how often a stale token's source is read again

# Slurm's error numbers, as Slurm 26.05 numbers them (slurm/slurm_errno.h at slurm-26-05-3-1; the enum
# counts on from each explicit value). Only those this client tells apart.
SLURM_COMMUNICATIONS_CONNECTION_ERROR = 1001  # ... _SEND_ERROR 1002, _RECEIVE_ERROR 1003, _SHUTDOWN_ERROR 1004
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR = 1800  # ... _SEND 1801, _RECEIVE 1802, _SHUTDOWN 1803, _BACKOFF 1804
ESLURM_ACCESS_DENIED = 2002  # e.g. another user's job where slurm.conf sets PrivateData=jobs
ESLURM_INVALID_JOB_ID = 2017
ESLURM_TRANSITION_STATE_NO_UPDATE = 2020  # "try again later": a job or node mid-transition
ESLURM_ALREADY_DONE = 2021
ESLURM_IN_STANDBY_MODE = 2027  # a backup slurmctld answered
ESLURM_NOT_SUPPORTED = 2036  # permanent: retrying never helps
ESLURM_JOB_NOT_PENDING = 2073
ESLURM_IN_STANDBY_USE_BACKUP = 2131
ESLURM_INVALID_NODE_STATE_TRANSITION = 2180
SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT = 5004
SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT = 5005

# Error numbers meaning "slurmctld did not answer / is busy / is not the primary": retrying may help.
_TEMPORARY_ERRNOS = {
    1001, 1002, 1003, 1004,  # SLURM_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR
    1800, 1801, 1802, 1803, 1804,  # SLURMCTLD_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR, _BACKOFF
    SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT, SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT,
    ESLURM_TRANSITION_STATE_NO_UPDATE,
    ESLURM_IN_STANDBY_MODE, ESLURM_IN_STANDBY_USE_BACKUP,
}
_TEMPORARY_TEXT = ("unable to contact slurm controller", "timed out", "try again", "connection refused",
                   "standby mode", "being configured", "zero bytes")
_AUTH_ERRNO = SLURM_PROTOCOL_AUTHENTICATION_ERROR
_INVALID_NODE_STATE_TRANSITION = ESLURM_INVALID_NODE_STATE_TRANSITION
_ALREADY_DONE = {ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE, ESLURM_JOB_NOT_PENDING}

# ---------------------------------------------------------------------------- tokens

class TokenSource(Protocol):
    """Where the client's token comes from."""

    def token(self) -> str:
        """A token that is valid for at least RENEW_BEFORE_S more, if it can have one."""

    def refresh(self) -> str:
        """A new token after slurmrestd rejected the last one."""

    def describe(self) -> str: ...


def token_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT, read without checking the signature (only slurmctld has the
    key); None when absent or unreadable."""
    try:
        exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
    except jwt.PyJWTError:
        return None
    return float(exp) if exp is not None else None


def token_claims(token: str) -> tuple[float | None, float | None]:
    """The `exp` and `iat` claims of a JWT, read without checking the signature; None where absent."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None, None
    exp, iat = claims.get("exp"), claims.get("iat")
    return (float(exp) if exp is not None else None), (float(iat) if iat is not None else None)


def token_user(token: str) -> str:
    """The Slurm user a token names (its `sun` claim, as slurmctld's auth/jwt reads it), read without checking the
    signature; '' when it names none."""
    try:
        return str(jwt.decode(token, options={"verify_signature": False}).get("sun") or "")
    except jwt.PyJWTError:
        return ""


class KeptToken:
    """A token someone else keeps fresh (a Slinky ``Token``'s controller), fetched again when the one in
    hand is within RENEW_BEFORE_S of its expiry, when its source says it changed, and on `refresh()`
    (a rejected token). A subclass says where it lives: `describe`, `_fetch` and, if its source can
    tell, `_changed`."""

    def __init__(self, clock=time.time):
        self._clock = clock
        self._token: str | None = None
        self._lock = threading.Lock()
        self._read_at = 0.0
        # Told each token in hand (the runtime's stale-token alarm: reconciler/runtime/token_alarm.py).
        self.observer: Callable[[str], None] | None = None

    def describe(self) -> str:
        raise NotImplementedError

    def _fetch(self) -> str:
        """The token its source holds now; a temporary SlurmError when there is none to be had."""
        raise NotImplementedError

    def _changed(self) -> bool:
        """Whether the source changed since the last fetch, when it can tell without fetching."""
        return False

    def _read(self) -> str:
        self._read_at = self._clock()
        self._token = self._fetch()
        return self._token

    def _stale(self, token: str) -> bool:
        """Past the point its keeper should have replaced it (reconciler/core/slurm_token.py): read its
        source again, at most every RECHECK_STALE_S, so a token re-minted since is seen at once."""
        exp, iat = token_claims(token)
        return assess(exp, iat, self._clock()).stopped and self._clock() - self._read_at >= RECHECK_STALE_S

    def _current(self) -> str:
        if self._token is None:
            return self._read()
        exp = token_expiry(self._token)
        if self._changed() or (exp is not None and exp - self._clock() < RENEW_BEFORE_S):
            return self._read()
        if self._stale(self._token):
            try:
                return self._read()
            except SlurmError:
                return self._token  # still valid for a while: a failed look for a newer one is no failure
        return self._token

    def _told(self, token: str) -> str:
        if self.observer is not None:
            self.observer(token)
        return token

    def token(self) -> str:
        with self._lock:
            token = self._current()
        return self._told(token)  # outside the lock: a page being sent holds up no Slurm call

    def refresh(self) -> str:
        with self._lock:
            token = self._read()
        return self._told(token)


class TokenFile(KeptToken):
    """A token kept fresh in a file: the Secret (key ``SLURM_JWT``) of a Slinky ``Token`` resource
    mounted into the pod; read again also when the file changed."""

    def __init__(self, path: Path | str, clock=time.time):
        super().__init__(clock)
        self.path = Path(path)
        self._mtime: float | None = None

    def describe(self) -> str:
        return f"token file {self.path}"

    def _fetch(self) -> str:
        try:
            text = self.path.read_text().strip()
            self._mtime = self.path.stat().st_mtime
        except OSError as e:
            raise SlurmError(f"Slurm REST: cannot read the token file {self.path}: {e}", temporary=True) from None
        if text.startswith("SLURM_JWT="):
            text = text.split("=", 1)[1].strip()
        if not text:
            raise SlurmError(f"Slurm REST: the token file {self.path} is empty", temporary=True)
        return text

    def _changed(self) -> bool:
        try:
            return self.path.stat().st_mtime != self._mtime
        except OSError:
            return True


class GivenToken:
    """A token handed over once: an engineer's own, as `scontrol token` prints it (`SLURM_JWT=...`, which Slurm's
    own clients read from the environment: Slurm's jwt documentation, "SLURM_JWT"). Never renewed here: when
    slurmrestd refuses it, the engineer asks slurmctld for a new one."""

    def __init__(self, token: str):
        token = token.strip()
        self._token = token.split("=", 1)[1].strip() if token.startswith("SLURM_JWT=") else token

    def describe(self) -> str:
        return "your token (SLURM_JWT)"

    def token(self) -> str:
        return self._token

    def refresh(self) -> str:
        raise SlurmError("Slurm REST: your token was refused (expired?): get a new one with "
                         "`export $(scontrol token)`")


class SignedToken:
    """Signs its own HS256 JWT with the cluster's JWT key (a mounted Secret), as Slinky's
    operator does: claims `sun` (the Slurm user), `iat`, `exp`."""

    def __init__(self, key_file: Path | str, user: str = "slurm", lifetime_s: int = 900, clock=time.time):
        self.key_file = Path(key_file)
        self.user = user
        self.lifetime_s = lifetime_s
        self._clock = clock
        self._token: str | None = None
        self._exp = 0.0
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"a token for {self.user} signed with {self.key_file}"

    def _sign(self) -> str:
        try:
            key = self.key_file.read_bytes()
        except OSError as e:
            raise SlurmError(f"Slurm REST: cannot read the JWT key {self.key_file}: {e}", temporary=True) from None
        now = int(self._clock())
        self._exp = now + self.lifetime_s
        self._token = jwt.encode({"sun": self.user, "iat": now, "exp": self._exp}, key, algorithm="HS256")
        return self._token

    def token(self) -> str:
        with self._lock:
            if self._token is None or self._exp - self._clock() < RENEW_BEFORE_S:
                return self._sign()
            return self._token

    def refresh(self) -> str:
        with self._lock:
            return self._sign()


# ---------------------------------------------------------------------------- models

class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class OpenAPIError(_Model):
    description: str = ""
    error_number: int = 0
    error: str = ""
    source: str = ""

    def __str__(self) -> str:
        parts = [p for p in (self.description, self.error) if p and p != "No error"]
        return f"{': '.join(parts) or 'error'} (Slurm error {self.error_number}, {self.source or '?'})"


class Envelope(_Model):
    errors: list[OpenAPIError] = Field(default_factory=list)
    warnings: list[dict[str, Any]] = Field(default_factory=list)


class NodeInfo(_Model):
    """v0.0.45/v0.0.44 `node` (PARSER_ARRAY(NODE) in src/plugins/data_parser/v0.0.45/parsers.c, slurm-26-05-3-1):
    `reason_set_by_user` is the user who set `reason` (its name, "" when slurmrestd cannot name the uid or there
    is no reason: DUMP_FUNC(NODE_REASON_USER_ID)), `reason_changed_at` when."""
    name: str
    state: list[str] = Field(default_factory=list)
    reason: str = ""
    reason_set_by_user: str | None = None
    reason_changed_at: "NoValInt | int | None" = None
    comment: str = ""
    partitions: list[str] = Field(default_factory=list)
    last_busy: "NoValInt | int | None" = None


class NodesResponse(Envelope):
    nodes: list[NodeInfo] = Field(default_factory=list)


class NoValInt(_Model):
    """Slurm's {"set", "infinite", "number"} for an optional integer."""
    set: bool = False
    infinite: bool = False
    number: int = 0


class ExitCode(_Model):
    """v0.0.45 process_exit_code_verbose: {"status": ["SUCCESS"], "return_code": {...}, "signal": {...}}."""
    status: list[str] = Field(default_factory=list)
    return_code: "NoValInt | int | None" = None
    signal: dict[str, Any] = Field(default_factory=dict)

    def __str__(self) -> str:
        status = ",".join(self.status)
        if "SIGNALED" in self.status:
            sig = _number(NoValInt.model_validate(self.signal.get("id") or {})) if isinstance(
                self.signal.get("id"), dict) else self.signal.get("id")
            return f"{status} {self.signal.get('name') or sig or ''}".strip()
        code = _number(self.return_code)
        return f"{status} {code}".strip() if code is not None else status


class JobInfo(_Model):
    job_id: int
    name: str = ""
    job_state: list[str] = Field(default_factory=list)
    nodes: str = ""
    requeue: bool = True
    state_reason: str = ""
    restart_cnt: int = 0
    hold: bool = False
    partition: str = ""
    node_count: "NoValInt | int | None" = None
    admin_comment: str = ""
    comment: str = ""
    user_name: str = ""
    account: str = ""
    submit_time: "NoValInt | int | None" = None
    start_time: "NoValInt | int | None" = None
    end_time: "NoValInt | int | None" = None
    exit_code: "ExitCode | None" = None


class JobsResponse(Envelope):
    jobs: list[JobInfo] = Field(default_factory=list)


class AccountedState(_Model):
    current: list[str] = Field(default_factory=list)
    reason: str = ""


class AccountedTime(_Model):
    submission: "NoValInt | int | None" = None
    start: "NoValInt | int | None" = None
    end: "NoValInt | int | None" = None


class AccountedComment(_Model):
    administrator: str = ""
    job: str = ""
    system: str = ""


class AccountedJob(_Model):
    """A job as slurmdbd records it: v0.0.45 `job` (src/plugins/data_parser/v0.0.45/parsers.c PARSER_ARRAY(JOB) at
    slurm-26-05-3-1: `state/current`, `time/submission`, `comment/administrator`, `user`, `restart_cnt`, ...)."""
    job_id: int
    name: str = ""
    account: str = ""
    user: str = ""
    partition: str = ""
    nodes: str = ""
    restart_cnt: int = 0
    state: AccountedState = Field(default_factory=AccountedState)
    time: AccountedTime = Field(default_factory=AccountedTime)
    comment: AccountedComment = Field(default_factory=AccountedComment)
    exit_code: "ExitCode | None" = None


class AccountedJobsResponse(Envelope):
    jobs: list[AccountedJob] = Field(default_factory=list)


class NodeUpdate(_Model):
    """v0.0.4x update_node_msg: the fields the client sets."""
    state: list[str]
    reason: str | None = None


class KillJobs(_Model):
    """v0.0.4x kill_jobs_msg."""
    jobs: list[str]
    signal: str
    flags: list[str] = Field(default_factory=lambda: ["FULL_JOB"])


class JobUpdate(_Model):
    """v0.0.4x job_desc_msg: the fields release() sets."""
    begin_time: NoValInt | None = None
    hold: bool | None = None
    admin_comment: str | None = None


class ReservationInfo(_Model):
    """v0.0.45/v0.0.44 `reservation_info`: the fields the client reads (`node_list` a hostlist expression)."""
    name: str
    node_list: str = ""
    flags: list[str] = Field(default_factory=list)


class ReservationsResponse(Envelope):
    reservations: list[ReservationInfo] = Field(default_factory=list)


class ReservationDesc(_Model):
    """v0.0.45/v0.0.44 `reservation_desc_msg` (POST /slurm/v0.0.45/reservation, "create or update a reservation",
    in the OpenAPI document `slurmrestd --generate-openapi-spec -s slurmctld -d v0.0.45` of slurm 26.05.5):
    `node_list` a hostlist string, `users` a csv_string (an array), `duration` in minutes."""
    name: str
    node_list: str
    start_time: NoValInt
    duration: NoValInt
    users: list[str]
    flags: list[str]


class OpenAPIDoc(_Model):
    paths: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------------------- client

class SlurmREST:
    """SlurmClient over slurmrestd (see the module docstring).

    Args:
        url: slurmrestd, e.g. ``http://slurm-restapi.slurm:6820`` (Slinky's RestApi Service).
        tokens: a TokenFile or SignedToken.
        timeout: seconds for each HTTP call (connect and read).
        parsers: the data parsers to consider, newest first (default all it knows).
        transport: for tests only (an httpx transport).
    """

    def __init__(self, url: str, tokens: TokenSource, *, timeout: float = 10.0,
                 parsers: Sequence[str] = KNOWN_PARSERS, transport: httpx.BaseTransport | None = None):
        unknown = set(parsers) - set(KNOWN_PARSERS)
        if unknown or not parsers:
            raise ValueError(f"parsers: {sorted(unknown) or 'none'}; this client knows {', '.join(KNOWN_PARSERS)}")
        self.parsers = tuple(parsers)
        self.url = url.rstrip("/")
        self.tokens = tokens
        self.timeout = timeout
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport)
        self._parser: str | None = None

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ plumbing

    @property
    def parser(self) -> str:
        """The data parser in use (asked of the server once)."""
        if self._parser is None:
            doc = self._call("GET", "/openapi/v3", OpenAPIDoc, versioned=False)
            offered = sorted({p.split("/")[2] for p in doc.paths if p.startswith("/slurm/v")})
            for v in self.parsers:
                if v in offered:
                    self._parser = v
                    log.info("Slurm REST %s: data parser %s (offered: %s)", self.url, v, ", ".join(offered))
                    break
            else:
                raise SlurmError(f"Slurm REST {self.url}: offers data parsers {offered or 'none'}, this client "
                                 f"speaks {', '.join(self.parsers)}", temporary=False)
        return self._parser

    def _call(self, method: str, path: str, model: type[Envelope] | type[OpenAPIDoc], *,
              body: BaseModel | None = None, versioned: bool = True, ok_status: Sequence[int] = ()):
        """One call; returns the parsed body. Raises SlurmError for transport errors, HTTP
        errors and `errors` in the body (unless the status is in `ok_status`)."""
        if versioned:
            path = f"/slurm/{self.parser}{path}"
        what = f"Slurm REST {method} {path}"
        payload = body.model_dump(exclude_none=True) if body is not None else None
        token = self.tokens.token()
        for attempt in (1, 2):
            try:
                r = self._http.request(method, path, json=payload, headers={TOKEN_HEADER: token})
            except httpx.TimeoutException as e:
                raise SlurmError(f"{what}: slurmrestd at {self.url} did not answer within {self.timeout:g}s "
                                 f"({type(e).__name__})", temporary=True) from None
            except httpx.TransportError as e:
                raise SlurmError(f"{what}: cannot reach slurmrestd at {self.url}: {e}", temporary=True) from None
            try:
                data = r.json()
            except ValueError:
                data = None
            errors: list[OpenAPIError] = []
            if isinstance(data, dict):
                try:
                    errors = Envelope.model_validate(data).errors
                except ValidationError:
                    errors = []
            rejected = r.status_code in (401, 511) or any(e.error_number == _AUTH_ERRNO for e in errors)
            if rejected and attempt == 1:
                token = self.tokens.refresh()
                continue
            break
        if rejected:
            exp = token_expiry(token)
            if exp is not None and exp <= time.time():
                raise SlurmError(f"{what}: slurmrestd rejected the token from {self.tokens.describe()}: it expired "
                                 f"{time.time() - exp:.0f}s ago and was not renewed yet", temporary=True)
            raise SlurmError(f"{what}: slurmrestd rejected the token from {self.tokens.describe()} (HTTP "
                             f"{r.status_code}, not expired: signed with another key than slurmctld's, or an "
                             f"unknown user){_errors_text(errors)}", temporary=False)
        if r.status_code in ok_status:
            return model.model_validate(data if isinstance(data, dict) else {})
        if r.status_code >= 400 or errors:
            temporary = r.status_code in (502, 503, 504) or any(_temporary(e) for e in errors)
            detail = _errors_text(errors) or f": {r.text[:300].strip()}"
            cause = _RESTError(errors) if errors else None
            raise SlurmError(f"{what} failed (HTTP {r.status_code}){detail}", temporary=temporary) from cause
        if not isinstance(data, dict):
            raise SlurmError(f"{what}: answer is not JSON: {r.text[:200]!r}", temporary=True)
        try:
            return model.model_validate(data)
        except ValidationError as e:
            raise SlurmError(f"{what}: unexpected answer: {e}", temporary=False) from None

    # ------------------------------------------------------------------ queries

    def node(self, name: str) -> SlurmNode:
        resp = self._call("GET", f"/node/{name}", NodesResponse)
        for n in resp.nodes:
            if n.name == name:
                return _node(n)
        raise SlurmError(f"Slurm REST GET /slurm/{self.parser}/node/{name}: no such node", temporary=False)

    def nodes(self) -> list[SlurmNode]:
        return sorted((_node(n) for n in self._call("GET", "/nodes/", NodesResponse).nodes), key=lambda n: n.name)

    def _jobs(self) -> list[JobInfo]:
        return self._call("GET", "/jobs/", JobsResponse).jobs

    def jobs_on_node(self, name: str) -> list[SlurmJob]:
        """Jobs running (or completing, suspended...) on the node; not pending ones."""
        out = []
        for j in self._jobs():
            if set(j.job_state) & ON_NODE_JOB_STATES and name in expand_hostlist(j.nodes):
                out.append(_job(j))
        return sorted(out, key=lambda j: j.job_id)

    def pending_jobs(self) -> list[SlurmJob]:
        return sorted((_job(j) for j in self._jobs() if PENDING in j.job_state), key=lambda j: j.job_id)

    def running_jobs(self) -> list[SlurmJob]:
        return sorted((_job(j) for j in self._jobs() if "RUNNING" in j.job_state), key=lambda j: j.job_id)

    def job(self, job_id: int) -> SlurmJob | None:
        """The job in any state slurmctld still knows; None when unknown, purged, or not this token's user's to
        see (PrivateData=jobs)."""
        try:
            resp = self._call("GET", f"/job/{int(job_id)}", JobsResponse, ok_status=(404,))
        except SlurmError as e:
            if _errnos(e) & {ESLURM_INVALID_JOB_ID, ESLURM_ACCESS_DENIED}:
                return None
            raise
        for j in resp.jobs:
            if j.job_id == int(job_id):
                return _job(j)
        return None

    def accounted_job(self, job_id: int) -> SlurmJob | None:
        """The job as accounting recorded it (`GET /slurmdb/v0.0.45/job/{id}`), for a job slurmctld forgot
        (MinJobAge); None when accounting has no record of it. Its latest record (a requeued job has one per
        run). Raises SlurmError where no accounting runs (slurmrestd answers with slurmdbd's error)."""
        resp = self._call("GET", f"/slurmdb/{self.parser}/job/{int(job_id)}", AccountedJobsResponse,
                          versioned=False, ok_status=(404,))
        runs = [j for j in resp.jobs if j.job_id == int(job_id)]
        return _accounted_job(runs[-1]) if runs else None

    def jobs_failed_on(self, names: Sequence[str], since: float) -> list[SlurmJob]:
        """`GET /slurmdb/v0.0.45/jobs/` with `node` (where the jobs ran), `state=NODE_FAIL`, `start_time`, `end_time` and
        `show_duplicates` (each run of a requeued job is its own record; without it slurmdbd answers with the
        latest, the pending one): src/plugins/data_parser/v0.0.45/parsers.c JOB_CONDITION and
        JOB_CONDITION_FLAGS at slurm-26-05-3-1. The failed runs only, their nodes those runs' (SlurmError where no
        accounting runs)."""
        if not names:
            return []
        # A state is matched within [start_time, end_time]: sacct sets the end to now itself, slurmrestd does not
        # (without it slurmdbd finds nothing).
        query = urlencode({"node": ",".join(sorted(set(names))), "state": "NODE_FAIL", "start_time": str(int(since)),
                           "end_time": str(int(time.time()) + 60), "show_duplicates": "true", "skip_steps": "true"})
        resp = self._call("GET", f"/slurmdb/{self.parser}/jobs/?{query}", AccountedJobsResponse, versioned=False)
        wanted = set(names)
        out: dict[int, SlurmJob] = {}
        for j in resp.jobs:
            job = _accounted_job(j)
            if job.state == "NODE_FAIL" and wanted & set(job.nodes):
                out[job.job_id] = job
        return sorted(out.values(), key=lambda j: j.job_id)

    # ------------------------------------------------------------------ nodes

    # ------------------------------------------------------------------ reservations (active checks)

    def reservations(self) -> list[SlurmReservation]:
        resp = self._call("GET", "/reservations/", ReservationsResponse)
        return sorted((SlurmReservation(r.name, tuple(expand_hostlist(r.node_list)) if r.node_list else (),
                                        frozenset(r.flags)) for r in resp.reservations), key=lambda r: r.name)

    def reserve_for_maintenance(self, name: str, nodes: Sequence[str], minutes: int) -> None:
        """POST /reservation with MAINT only (no IGNORE_JOBS: slurmctld refuses nodes that run a job), starting now,
        for the token's user. The call creates or updates: the name is new each time (it carries when)."""
        self._call("POST", "/reservation", Envelope, body=ReservationDesc(
            name=name, node_list=",".join(nodes), start_time=NoValInt(set=True, number=int(time.time())),
            duration=NoValInt(set=True, number=int(minutes)), users=[self._user()], flags=["MAINT"]))

    def _user(self) -> str:
        user = token_user(self.tokens.token())
        if not user:
            raise SlurmError(f"Slurm REST: the token from {self.tokens.describe()} names no user (claim sun): a "
                             "reservation is made for a user", temporary=False)
        return user

    def delete_reservation(self, name: str) -> None:
        """DELETE /reservation/{name}; one not there (deleted, or ended) is already what was asked."""
        try:
            self._call("DELETE", f"/reservation/{name}", Envelope)
        except SlurmError as e:
            if not e.temporary and name not in {r.name for r in self.reservations()}:
                return
            raise

    def _update_node(self, name: str, update: NodeUpdate) -> None:
        self._call("POST", f"/node/{name}", Envelope, body=update)

    def drain(self, name: str, reason: str) -> None:
        self._update_node(name, NodeUpdate(state=["DRAIN"], reason=reason or "gpufleet"))

    def down(self, name: str, reason: str) -> None:
        self._update_node(name, NodeUpdate(state=["DOWN"], reason=reason or "gpufleet"))

    def resume(self, name: str) -> None:
        """RESUME; a node that is neither drained nor down is left as it is (not an error)."""
        try:
            self._update_node(name, NodeUpdate(state=["RESUME"]))
        except SlurmError as e:
            if _INVALID_NODE_STATE_TRANSITION in _errnos(e) and not self.node(name).drained_or_down:
                return
            raise

    # ------------------------------------------------------------------ jobs

    def signal_jobs(self, job_ids: Sequence[int], signal: str = "TERM") -> None:
        """Signal the batch script (and its children) and every step of each running job;
        pending or ended ones are skipped. Unknown ids raise (permanent) after the others
        were signalled."""
        ids = [int(j) for j in dict.fromkeys(job_ids)]
        if not ids:
            return
        sig = str(signal).upper()
        sig = sig if sig.startswith("SIG") else f"SIG{sig}"
        targets, unknown = signal_targets(ids, self.job)
        if targets:
            self._call("DELETE", "/jobs/", Envelope, body=KillJobs(jobs=[str(j) for j in targets], signal=sig))
        if unknown:
            raise SlurmError(f"Slurm REST signal {sig}: unknown job(s) {', '.join(map(str, unknown))}",
                             temporary=False)

    def requeue(self, job_ids: Sequence[int]) -> None:
        """Requeue each job (running ones are killed first). Already pending: no-op. On
        v0.0.44 see the module docstring."""
        ids = [int(j) for j in dict.fromkeys(job_ids)]
        if self.parser == "v0.0.44":
            return self._requeue_by_node_down(ids)
        for jid in ids:
            try:
                self._call("GET", f"/job/{jid}/requeue", Envelope)
            except SlurmError as e:
                if e.temporary:
                    raise
                job = self.job(jid)
                if job is not None and job.state == PENDING:
                    continue
                raise

    def _requeue_by_node_down(self, ids: list[int]) -> None:
        for jid in ids:
            job = self.job(jid)
            if job is None:
                raise SlurmError(f"Slurm REST requeue (v0.0.44): unknown job {jid}", temporary=False)
            if job.state not in ON_NODE_JOB_STATES:
                continue
            drained = [n for n in job.nodes if self.node(n).drained_or_down]
            if not drained:
                raise SlurmError(f"Slurm REST requeue (v0.0.44 has no requeue call): job {jid} has no drained "
                                 f"node to set DOWN (nodes {', '.join(job.nodes)}); drain the faulted node first",
                                 temporary=False)
            node = self.node(drained[0])
            self.down(node.name, node.reason or "gpufleet: requeue")

    def release(self, job_ids: Sequence[int]) -> None:
        """Make pending jobs eligible now: move the begin time a requeue sets to now and
        lift a hold. Jobs that run or ended are left alone."""
        for jid in dict.fromkeys(int(j) for j in job_ids):
            job = self.job(jid)
            if job is None or job.state != PENDING:
                continue
            update = JobUpdate(begin_time=NoValInt(set=True, number=int(time.time())))
            if "held" in job.reason.lower():
                update.hold = False
            try:
                self._call("POST", f"/job/{jid}", Envelope, body=update)
            except SlurmError as e:
                if not e.temporary and _errnos(e) & _ALREADY_DONE:
                    continue
                raise


    def set_admin_comment(self, job_id: int, text: str) -> None:
        """POST /slurm/v0.0.45/job/{id} with job_desc_msg's `admin_comment` (slurmrestd's generated OpenAPI
        for Slurm 26.05: `v0.0.45_job_desc_msg.admin_comment`); slurmctld takes it from a super user only
        (the SlurmUser or root: slurm-26-05-3-1 src/slurmctld/job_mgr.c `_update_job`), else
        ESLURM_ACCESS_DENIED (permanent)."""
        self._call("POST", f"/job/{int(job_id)}", Envelope, body=JobUpdate(admin_comment=text))


class _RESTError(Exception):
    """Carries the body's errors as the cause of a SlurmError (for classification)."""

    def __init__(self, errors: list[OpenAPIError]):
        super().__init__("; ".join(map(str, errors)))
        self.errors = errors


def _errnos(e: SlurmError) -> set[int]:
    cause = e.__cause__
    return {x.error_number for x in cause.errors} if isinstance(cause, _RESTError) else set()


def _temporary(e: OpenAPIError) -> bool:
    text = f"{e.description} {e.error}".lower()
    return e.error_number in _TEMPORARY_ERRNOS or any(t in text for t in _TEMPORARY_TEXT)


def _errors_text(errors: list[OpenAPIError]) -> str:
    return (": " + "; ".join(map(str, errors))) if errors else ""


def _number(v: "NoValInt | int | None") -> int | None:
    if isinstance(v, NoValInt):
        return v.number if v.set and not v.infinite else None
    return v


def _node(n: NodeInfo) -> SlurmNode:
    busy = _number(n.last_busy)
    return SlurmNode(name=n.name, states=frozenset(s.upper() for s in n.state), reason=n.reason, comment=n.comment,
                     partitions=tuple(n.partitions), last_busy=float(busy) if busy else None,
                     reason_set_by=n.reason_set_by_user if n.reason else None,
                     reason_changed_at=_epoch(n.reason_changed_at) if n.reason else None)


def _job(j: JobInfo) -> SlurmJob:
    state = next((s for s in j.job_state if s in ON_NODE_JOB_STATES | {PENDING}), j.job_state[0] if j.job_state else "")
    reason = "" if j.state_reason in ("None", "(null)") else j.state_reason
    return SlurmJob(job_id=j.job_id, name=j.name, state=state, nodes=tuple(expand_hostlist(j.nodes)),
                    requeue=j.requeue, reason=reason, restarts=j.restart_cnt,
                    partitions=tuple(p for p in j.partition.split(",") if p), node_count=_number(j.node_count) or 1,
                    hold=j.hold, admin_comment=j.admin_comment, comment=j.comment, user=j.user_name,
                    account=j.account, submit_time=_epoch(j.submit_time), start_time=_epoch(j.start_time),
                    end_time=_epoch(j.end_time), exit_code=str(j.exit_code) if j.exit_code else "")


def _accounted_job(j: AccountedJob) -> SlurmJob:
    reason = "" if j.state.reason in ("None", "(null)") else j.state.reason
    return SlurmJob(job_id=j.job_id, name=j.name, state=j.state.current[0] if j.state.current else "",
                    nodes=tuple(expand_hostlist(j.nodes)) if j.nodes not in ("", "None assigned") else (),
                    reason=reason, restarts=j.restart_cnt, partitions=tuple(p for p in j.partition.split(",") if p),
                    admin_comment=j.comment.administrator, comment=j.comment.job, user=j.user, account=j.account,
                    submit_time=_epoch(j.time.submission), start_time=_epoch(j.time.start),
                    end_time=_epoch(j.time.end), exit_code=str(j.exit_code) if j.exit_code else "")


def _epoch(v: "NoValInt | int | None") -> float | None:
    n = _number(v)
    return float(n) if n else None
