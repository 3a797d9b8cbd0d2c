"""The Token that stops refreshing (slurm-operator v1.2.1: a pass that re-mints returns RequeueAfter <= 0 and the
Token is not visited again until its object changes; reconciler/core/slurm_token.py cites the code path),
reproduced by the stand-in's token controller (`token_v121_requeue`) against a real API server and a real
Slurm 26.05 behind slurmrestd. The reconciler reads its token from the Secret and nudges the Token with its
own ServiceAccount's token, under the stack's Role (components/slinky.py token_reader_rules) and admission
policy (components/admission.py reconciler_token_policy):

- the token is re-minted once, then never again: it expires and Slurm refuses it;
- the reconciler's next Slurm action sees it expired, writes its condition onto the Token (the nudge), the
  stand-in visits the changed Token and re-mints, and Slurm actions work again, with no page;
- with the operator down the nudge cannot help: one page, saying what was done;
- with the same rights, the reconciler cannot change the Token's spec, another annotation, or another Token.
"""
from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator

import jwt
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from gpufleet.components.admission import binding, reconciler_token_policy
from gpufleet.components.slinky import GROUP, TOKEN_KEY, TOKEN_NAME, TOKEN_SECRET, VERSION, crd_manifest, token_reader_rules
from gpufleet.fleetspec import labels, load_stack_file
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.waiting import wait_for
from localenv.slinky_standin import SlinkyStandIn
from gpufleet.reconciler.adapters.slurm import SlurmError
from gpufleet.reconciler.adapters.slurm.rest import SlurmREST
from gpufleet.reconciler.adapters.slurm.token_secret import SecretRef, SecretToken, TokenNudge
from gpufleet.reconciler.core.slurm_token import NUDGE_GRACE_S
from gpufleet.reconciler.runtime.metrics import Metrics
from gpufleet.reconciler.runtime.token_alarm import TokenAlarm
from tests.fixtures.kube_cluster import create_or_keep
from tests.fixtures.slurm_cluster import RECONCILER_USER
from tests.integration.test_admission import token_client
from tests.integration.test_reconciler_rbac import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SLURM_NS, SYSTEM_NS, SA = "gf-t240-slurm", "gf-t240-system", "gf-t240-reconciler"
LIFETIME = 12  # seconds: re-minted at 4/5 of it (token_sync.go), so the stop shows within half a minute


def spec() -> FleetSpec:
    doc = load_stack_file(ROOT / "Pulumi.local.yaml").fleet.model_dump(mode="json")
    doc["healing"]["reconciler"]["namespace"] = SYSTEM_NS
    doc["slurm"]["namespace"] = SLURM_NS
    return FleetSpec.model_validate(doc)


def _status(fn, *args, **kw) -> int:
    try:
        fn(*args, **kw)
        return 200
    except ApiException as e:
        return e.status


class World:
    def __init__(self, kube, slurm):
        self.admin = kube.api_client()
        self.core = client.CoreV1Api(self.admin)
        self.custom = client.CustomObjectsApi(self.admin)
        rbac, adm = client.RbacAuthorizationV1Api(self.admin), client.AdmissionregistrationV1Api(self.admin)
        ext = client.ApiextensionsV1Api(self.admin)
        create_or_keep(ext.create_custom_resource_definition, crd_manifest("Token"))
        wait_for("the Token CRD established", lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(f"tokens.{GROUP}").status.conditions or []), timeout=30)
        for ns in (SLURM_NS, SYSTEM_NS):
            create_or_keep(self.core.create_namespace, {"metadata": {"name": ns}})
        create_or_keep(self.core.create_namespaced_service_account, SYSTEM_NS, {"metadata": {"name": SA}})
        create_or_keep(rbac.create_namespaced_role, SLURM_NS, {"metadata": {"name": SA}, "rules": token_reader_rules()})
        create_or_keep(rbac.create_namespaced_role_binding, SLURM_NS, {
            "metadata": {"name": SA}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SA},
            "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": SYSTEM_NS}]})
        self.policy = reconciler_token_policy(spec(), f"system:serviceaccount:{SYSTEM_NS}:{SA}")
        create_or_keep(adm.create_validating_admission_policy, self.policy)
        create_or_keep(adm.create_validating_admission_policy_binding, binding(self.policy))
        token = self.core.create_namespaced_service_account_token(SA, SYSTEM_NS, {"spec": {"expirationSeconds": 600}})
        self.reconciler = token_client(kube, token.status.token)
        self.slurm = slurm

    def declare_token(self, lifetime: int = LIFETIME) -> None:
        """The stack's Token (components/slinky.py), with a short lifetime; no Secret yet."""
        for fn, args in ((self.custom.delete_namespaced_custom_object, (GROUP, VERSION, SLURM_NS, "tokens", TOKEN_NAME)),
                         (self.core.delete_namespaced_secret, (TOKEN_SECRET, SLURM_NS))):
            if _status(fn, *args) not in (200, 404):
                raise AssertionError(f"cannot clear {args}")
        wait_for("the old Token gone", lambda: _status(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, SLURM_NS, "tokens", TOKEN_NAME) == 404, timeout=30)
        self.custom.create_namespaced_custom_object(GROUP, VERSION, SLURM_NS, "tokens", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Token", "metadata": {"name": TOKEN_NAME},
            "spec": {"jwtKeyRef": {"name": "slurm-auth-jwt", "key": "jwt.key"}, "username": RECONCILER_USER,
                     "lifetime": f"{lifetime}s", "refresh": True,
                     "secretRef": {"name": TOKEN_SECRET, "key": TOKEN_KEY}}})

    def minted(self) -> str | None:
        try:
            data = self.core.read_namespaced_secret(TOKEN_SECRET, SLURM_NS).data or {}
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return base64.b64decode(data.get(TOKEN_KEY, "")).decode() or None

    def condition(self) -> dict | None:
        t = self.custom.get_namespaced_custom_object(GROUP, VERSION, SLURM_NS, "tokens", TOKEN_NAME)
        text = (t["metadata"].get("annotations") or {}).get(labels.TOKEN_NUDGE)
        return json.loads(text) if text else None


def exp(token: str) -> float:
    return float(jwt.decode(token, options={"verify_signature": False})["exp"])


@pytest.fixture
def world(kube_cluster, slurm_fresh) -> Iterator[World]:
    yield World(kube_cluster, slurm_fresh)


class Operator:
    """The stand-in's Token controller in its own thread, as the operator's manager runs it."""

    def __init__(self, w: World):
        self.standin = SlinkyStandIn(w.admin, w.slurm, [], namespace=SLURM_NS, token_v121_requeue=True)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.standin._sync_tokens()
            self.stop.wait(0.2)

    def __enter__(self) -> "Operator":
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        self.thread.join(10)


def reconciler(w: World, clock=time.time) -> tuple[SlurmREST, Metrics, list]:
    source = SecretToken(w.reconciler, SecretRef(SLURM_NS, TOKEN_SECRET, TOKEN_KEY), clock=clock)
    metrics, pages = Metrics(CollectorRegistry()), []
    source.observer = TokenAlarm(metrics, pages.append, source.describe(), clock, token_ref=(SLURM_NS, TOKEN_NAME),
                                 nudge=TokenNudge(w.reconciler, SLURM_NS, TOKEN_NAME)).observe
    return SlurmREST(w.slurm.rest_url, source, timeout=10), metrics, pages


def works(rest: SlurmREST) -> bool:
    try:
        return bool(rest.nodes())
    except SlurmError as e:
        assert e.temporary, e  # an expired token reads as a temporary error
        return False


def stalled(w: World) -> str:
    """Wait for the stop: the token re-minted once (the pass that returns <= 0), then left to expire, and still
    the same token a few seconds after expiry."""
    first = wait_for("the first token", w.minted, timeout=30)
    second = wait_for("the re-minted token", lambda: (t := w.minted()) != first and t, timeout=LIFETIME + 10)
    wait_for("the token expired", lambda: time.time() > exp(second) + 3, timeout=LIFETIME + 10)
    assert w.minted() == second, "the stand-in re-minted without being woken: the stop is not reproduced"
    return second


def test_the_stalled_token_is_nudged_reminted_and_slurm_works_again_without_a_page(world) -> None:
    world.declare_token()
    rest, metrics, pages = reconciler(world)
    with Operator(world):
        wait_for("Slurm answers with the minted token", lambda: works(rest), timeout=30)
        dead = stalled(world)
        # The next Slurm action: the token is expired; the reconciler nudges its Token (its own rights)...
        works(rest)
        cond = world.condition()
        assert cond is not None and cond["status"] == "False" and cond["reason"] == "Expired" and cond["nudges"] >= 1
        assert metrics.registry.get_sample_value("gpufleet_slurm_token_nudges_total") >= 1
        # ...the changed Token is reconciled: re-minted, and Slurm actions work again.
        wait_for("Slurm answers again", lambda: works(rest), timeout=30)
        assert world.minted() != dead and exp(world.minted()) > time.time()
        wait_for("the condition lowered", lambda: (world.condition() or {}).get("status") == "True", timeout=10)
    assert pages == [] and metrics.registry.get_sample_value("gpufleet_slurm_token_stale") == 0


def test_with_the_operator_down_the_nudge_cannot_help_and_pages_once(world) -> None:
    world.declare_token()
    skew = [0.0]
    rest, metrics, pages = reconciler(world, clock=lambda: time.time() + skew[0])
    with Operator(world):
        stalled(world)
    # the operator is down now: the nudges are written, nobody answers
    assert not works(rest) and pages == []
    assert (world.condition() or {}).get("status") == "False"
    skew[0] = NUDGE_GRACE_S  # still stale past the grace
    for _ in range(3):
        assert not works(rest)
    assert len(pages) == 1 and pages[0].severity == "critical"
    assert f"nudged Token {SLURM_NS}/{TOKEN_NAME}" in pages[0].text and "is the operator running" in pages[0].text


def test_the_reconciler_changes_only_its_condition_on_its_own_token(world) -> None:
    world.declare_token(lifetime=3600)
    custom = client.CustomObjectsApi(world.reconciler)
    # the policy acts once the API server's admission has loaded it
    wait_for("the token policy in force", lambda: _status(
        custom.patch_namespaced_custom_object, GROUP, VERSION, SLURM_NS, "tokens", TOKEN_NAME,
        {"spec": {"lifetime": "8760h"}}, dry_run="All") == 403, timeout=60)
    TokenNudge(world.reconciler, SLURM_NS, TOKEN_NAME)({"type": "SlurmTokenFresh", "status": "False"})
    assert world.condition() == {"type": "SlurmTokenFresh", "status": "False"}
    for body in ({"spec": {"username": "root"}}, {"spec": {"refresh": False}},
                 {"metadata": {"annotations": {"other": "x"}}}, {"metadata": {"labels": {"a": "b"}}}):
        assert _status(custom.patch_namespaced_custom_object, GROUP, VERSION, SLURM_NS, "tokens", TOKEN_NAME,
                       body) == 403, body
    other = "someone-elses"
    create_or_keep(world.custom.create_namespaced_custom_object, GROUP, VERSION, SLURM_NS, "tokens", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Token", "metadata": {"name": other},
        "spec": {"jwtKeyRef": {"name": "slurm-auth-jwt", "key": "jwt.key"}, "username": "nobody", "refresh": False}})
    try:
        assert _status(custom.patch_namespaced_custom_object, GROUP, VERSION, SLURM_NS, "tokens", other,
                       {"metadata": {"annotations": {labels.TOKEN_NUDGE: "{}"}}}) == 403  # RBAC: that one Token only
    finally:
        world.custom.delete_namespaced_custom_object(GROUP, VERSION, SLURM_NS, "tokens", other)
