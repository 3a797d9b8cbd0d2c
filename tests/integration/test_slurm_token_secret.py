"""The reconciler's Slurm token, read from the Slurm namespace through a real API server with the
reconciler's own ServiceAccount token, bound to the stack's rules (components/slinky.py
token_reader_rules): the minted token is read, and renewed when the Token's controller rewrites it;
the JWT signing key beside it, and any listing of Secrets there, are refused.
"""
from __future__ import annotations

import time

import jwt
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.components.slinky import JWT_KEY, JWT_SECRET, TOKEN_KEY, TOKEN_SECRET, token_reader_rules
from gpufleet.reconciler.adapters.slurm import SlurmError
from gpufleet.reconciler.adapters.slurm.rest import RENEW_BEFORE_S
from gpufleet.reconciler.adapters.slurm.token_secret import SecretRef, SecretToken
from tests.fixtures.kube_cluster import create_or_keep
from tests.integration.test_admission import token_client

pytestmark = pytest.mark.integration

SLURM_NS, READER_NS, READER = "gf-tok-slurm", "gf-tok-system", "gf-tok-reconciler"
KEY = "k" * 32


def minted(exp: float, user: str = "slurm") -> str:
    return jwt.encode({"sun": user, "iat": int(exp) - 3600, "exp": int(exp)}, KEY, algorithm="HS256")


def write_token(core: client.CoreV1Api, token: str) -> None:
    body = {"metadata": {"name": TOKEN_SECRET}, "stringData": {TOKEN_KEY: token}}
    try:
        core.create_namespaced_secret(SLURM_NS, body)
    except ApiException as e:
        if e.status != 409:
            raise
        core.replace_namespaced_secret(TOKEN_SECRET, SLURM_NS, body)


@pytest.fixture(scope="module")
def setup(kube_cluster):
    """The Slurm namespace with the key and the minted token (as the Token's controller leaves them), and
    a reconciler ServiceAccount in its own namespace bound to the stack's reader Role there."""
    admin = kube_cluster.api_client()
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    for ns in (SLURM_NS, READER_NS):
        create_or_keep(core.create_namespace, {"metadata": {"name": ns}})
    create_or_keep(core.create_namespaced_secret, SLURM_NS, {"metadata": {"name": JWT_SECRET}, "stringData": {JWT_KEY: KEY}})
    create_or_keep(core.create_namespaced_service_account, READER_NS, {"metadata": {"name": READER}})
    create_or_keep(rbac.create_namespaced_role, SLURM_NS, {"metadata": {"name": READER}, "rules": token_reader_rules()})
    create_or_keep(rbac.create_namespaced_role_binding, SLURM_NS, {
        "metadata": {"name": READER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": READER},
        "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": READER_NS}]})
    token = core.create_namespaced_service_account_token(READER, READER_NS, {"spec": {"expirationSeconds": 600}})
    return core, token_client(kube_cluster, token.status.token)


def test_the_reconciler_reads_its_minted_token_and_its_renewal(setup):
    core, reconciler = setup
    first = minted(time.time() + 3600)
    write_token(core, first)
    source = SecretToken(reconciler, SecretRef(SLURM_NS, TOKEN_SECRET, TOKEN_KEY))
    assert source.token() == first
    # The Token's controller rewrites the Secret a fifth of the lifetime before expiry; the source reads
    # again when the token in hand is within RENEW_BEFORE_S of it.
    renewed = minted(time.time() + 3600 + 60)
    write_token(core, renewed)
    assert source.token() == first  # still an hour left: no read
    assert source.refresh() == renewed  # slurmrestd rejected it: read again
    near = minted(time.time() + RENEW_BEFORE_S / 2)
    write_token(core, near)
    source = SecretToken(reconciler, SecretRef(SLURM_NS, TOKEN_SECRET, TOKEN_KEY))
    assert source.token() == near
    write_token(core, renewed)
    assert source.token() == renewed


def test_the_key_beside_it_and_a_listing_are_refused(setup):
    _, reconciler = setup
    as_reconciler = client.CoreV1Api(reconciler)
    for call in (lambda: as_reconciler.read_namespaced_secret(JWT_SECRET, SLURM_NS),
                 lambda: as_reconciler.list_namespaced_secret(SLURM_NS),
                 lambda: as_reconciler.read_namespaced_secret(TOKEN_SECRET, READER_NS)):
        with pytest.raises(ApiException) as e:
            call()
        assert e.value.status == 403
    # and a source pointed at the key says so, temporary (the platform may fix the Role), naming no value
    with pytest.raises(SlurmError) as err:
        SecretToken(reconciler, SecretRef(SLURM_NS, JWT_SECRET, JWT_KEY)).token()
    assert err.value.temporary and "HTTP 403" in str(err.value) and KEY not in str(err.value)


def test_a_token_its_token_stopped_refreshing_is_read_again_and_paged_once(setup):
    """The Token stopped re-minting (slurm-operator 1.2.1, reconciler/core/slurm_token.py): the token in
    hand, past its refresh point, is looked for again every RECHECK_STALE_S through the reconciler's own
    rights, one page goes out, and a token minted again ends the episode."""
    from prometheus_client import CollectorRegistry

    from gpufleet.reconciler.adapters.slurm.rest import RECHECK_STALE_S
    from gpufleet.reconciler.runtime.metrics import Metrics
    from gpufleet.reconciler.runtime.token_alarm import TokenAlarm

    core, reconciler = setup
    now = [time.time()]
    stale = minted(now[0] + 600)  # an hour's token with 10 min left: due for re-minting 2 min ago
    write_token(core, stale)
    source = SecretToken(reconciler, SecretRef(SLURM_NS, TOKEN_SECRET, TOKEN_KEY), clock=lambda: now[0])
    metrics, pages = Metrics(CollectorRegistry()), []
    source.observer = TokenAlarm(metrics, pages.append, source.describe(), lambda: now[0]).observe
    for _ in range(3):
        assert source.token() == stale
        now[0] += RECHECK_STALE_S
    assert len(pages) == 1 and metrics.registry.get_sample_value("gpufleet_slurm_token_stale") == 1
    again = minted(now[0] + 3600)
    write_token(core, again)
    now[0] += RECHECK_STALE_S
    assert source.token() == again
    assert len(pages) == 1 and metrics.registry.get_sample_value("gpufleet_slurm_token_stale") == 0
