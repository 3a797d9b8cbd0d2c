"""Token sources of the REST client, and what it makes of slurmrestd's answers, without a cluster
(the same calls against a real slurmrestd are in tests/integration/test_slurm_rest.py)."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import jwt
import pytest

from localenv import slinky_update
from localenv.slinky_standin import POD_HOSTNAME_LABEL, NodeSetDef, pod_manifest
from gpufleet.reconciler.adapters.slurm import SlurmError
from gpufleet.reconciler.adapters.slurm.rest import SignedToken, SlurmREST, TokenFile, token_expiry

KEY = b"k" * 32


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def tok(exp: float, user: str = "slurm") -> str:
    return jwt.encode({"sun": user, "exp": int(exp), "iat": int(exp) - 900}, KEY, algorithm="HS256")


def test_signed_token_claims_and_renewal() -> None:
    clock = Clock()
    src = SignedToken(Path("/dev/null"), user="root", lifetime_s=900, clock=clock)
    src.key_file = Path(__file__)  # any readable file is a key
    first = src.token()
    claims = jwt.decode(first, Path(__file__).read_bytes(), algorithms=["HS256"], options={"verify_exp": False})
    assert claims["sun"] == "root" and claims["exp"] - claims["iat"] == 900
    clock.t += 500
    assert src.token() == first  # still 400 s left
    clock.t += 350
    assert src.token() != first  # within a minute of expiry: signed again


def test_token_file_rereads_near_expiry_and_when_changed(tmp_path: Path) -> None:
    clock = Clock()
    f = tmp_path / "SLURM_JWT"
    f.write_text(tok(clock.t + 900) + "\n")
    src = TokenFile(f, clock=clock)
    a = src.token()
    assert token_expiry(a) == clock.t + 900
    f.write_text("SLURM_JWT=" + tok(clock.t + 1800))  # env-file form is accepted too
    assert src.token() != a  # the file changed
    clock.t += 1790
    b = src.token()
    assert token_expiry(b) == 1_000_000 + 1800


def test_missing_token_file_is_temporary(tmp_path: Path) -> None:
    with pytest.raises(SlurmError) as ei:
        TokenFile(tmp_path / "nope").token()
    assert ei.value.temporary and "nope" in str(ei.value)


def answer(status: int, body: dict) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi/v3":
            return httpx.Response(200, json={"paths": {"/slurm/v0.0.43/ping/": {}, "/slurm/v0.0.44/ping/": {}}})
        return httpx.Response(status, json=body)
    return httpx.MockTransport(handler)


def test_parser_choice_and_errors_in_the_body() -> None:
    src = SignedToken(Path(__file__))
    body = {"errors": [{"description": "Failure to update node x", "error_number": 2009,
                        "error": "Invalid node name specified", "source": "_update_node"}]}
    c = SlurmREST("http://slurm:6820", src, transport=answer(422, body))
    with pytest.raises(SlurmError) as ei:
        c.drain("x", "r")
    assert c.parser == "v0.0.44"  # the newest it knows of those offered
    assert not ei.value.temporary
    assert "POST /slurm/v0.0.44/node/x" in str(ei.value) and "Invalid node name" in str(ei.value)
    busy = {"errors": [{"description": "Unable to contact slurm controller (connect failure)",
                        "error_number": 1001, "error": "Communication connection failure", "source": "x"}]}
    c = SlurmREST("http://slurm:6820", src, transport=answer(500, busy))
    with pytest.raises(SlurmError) as ei:
        c.node("x")
    assert ei.value.temporary
    with pytest.raises(SlurmError) as ei:
        SlurmREST("http://slurm:6820", src, parsers=("v0.0.45",), transport=answer(200, {})).node("x")
    assert "offers data parsers ['v0.0.43', 'v0.0.44']" in str(ei.value) and not ei.value.temporary


def test_standin_pod_is_named_as_slinky_names_it() -> None:
    """slurm-operator v1.2.1 controller/nodeset/utils/utils.go GetOrdinalPodName, initIdentity;
    builder/labels/labels.go WithWorkerLabels; pkg/taints/taints.go TolerationWorkerNode."""
    ns = NodeSetDef("h100", 2, {"node-restriction.kubernetes.io/gpufleet-pool": "h100"}, [], gpus=8).resource("slurm")
    pod = pod_manifest(ns, 1, "slurm")
    assert pod["metadata"]["name"] == "h100-1"
    assert pod["spec"]["hostname"] == "h100-1" == pod["metadata"]["labels"][POD_HOSTNAME_LABEL]
    assert {k: v for k, v in pod["metadata"]["labels"].items() if not k.startswith("nodeset.")} == {
        "app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": "h100",
        "app.kubernetes.io/component": "worker", "slinky.slurm.net/cluster": "slurm",
        "controller-revision-hash": slinky_update.revision(ns)}  # historycontrol/utils.go SetRevision
    assert pod["metadata"]["labels"]["nodeset.slinky.slurm.net/pod-index"] == "1"
    assert pod["metadata"]["labels"]["nodeset.slinky.slurm.net/scaling-mode"] == "StatefulSet"
    assert pod["spec"]["nodeSelector"] == {"node-restriction.kubernetes.io/gpufleet-pool": "h100"}
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["spec"]["tolerations"] == [{"key": "nodeset.slinky.slurm.net/worker", "operator": "Equal",
                                           "effect": "NoExecute"}]
    padded = {**ns, "spec": {**ns["spec"], "ordinalPadding": 3}}
    assert pod_manifest(padded, 7, "slurm")["metadata"]["name"] == "h100-007"
    json.dumps(pod)
