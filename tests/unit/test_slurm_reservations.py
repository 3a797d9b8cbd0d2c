"""The REST client's reservation calls (active checks: reconciler/core/active_checks.py), against a slurmrestd
stand-in (httpx.MockTransport) that answers as slurm 26.05.5's v0.0.45 OpenAPI document has them: POST
/reservation with a reservation_desc_msg, GET /reservations/, DELETE /reservation/{name}."""
from __future__ import annotations

import json
import time

import httpx
import jwt

from gpufleet.reconciler.adapters.slurm.rest import SlurmREST


class _Tokens:
    def token(self) -> str:
        return jwt.encode({"sun": "gpufleet", "exp": 4102444800}, "k" * 32, algorithm="HS256")

    def refresh(self) -> str:
        return self.token()

    def describe(self) -> str:
        return "test"


def _slurmrestd():
    made: dict[str, dict] = {}

    def answer(req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path == "/openapi/v3":
            return httpx.Response(200, json={"paths": {"/slurm/v0.0.45/ping/": {}}})
        if req.method == "POST" and path == "/slurm/v0.0.45/reservation":
            body = json.loads(req.content)
            made[body["name"]] = body
            return httpx.Response(200, json={"errors": []})
        if req.method == "GET" and path == "/slurm/v0.0.45/reservations/":
            return httpx.Response(200, json={"reservations": [
                {"name": b["name"], "node_list": b["node_list"], "flags": b["flags"] + ["SPEC_NODES"]}
                for b in made.values()]})
        if req.method == "DELETE" and path.startswith("/slurm/v0.0.45/reservation/"):
            name = path.rsplit("/", 1)[1]
            if made.pop(name, None) is None:  # slurmctld's answer for a reservation it does not have
                return httpx.Response(500, json={"errors": [{"error_number": 2011, "description": "",
                                                             "error": "Requested reservation is invalid",
                                                             "source": "slurmctld"}]})
            return httpx.Response(200, json={"errors": []})
        return httpx.Response(404, json={"errors": [{"error_number": 9000, "error": "no such path"}]})
    return SlurmREST("http://slurmrestd", _Tokens(), transport=httpx.MockTransport(answer)), made


def test_a_maintenance_reservation_for_the_tokens_user_starting_now_then_deleted_twice():
    rest, made = _slurmrestd()
    rest.reserve_for_maintenance("gpufleet-check-n-1", ["gpu-a-0", "gpu-a-1"], 32)
    body = made["gpufleet-check-n-1"]
    assert body["node_list"] == "gpu-a-0,gpu-a-1" and body["flags"] == ["MAINT"]  # never IGNORE_JOBS
    assert body["users"] == ["gpufleet"] and body["duration"] == {"set": True, "infinite": False, "number": 32}
    assert body["start_time"]["set"] and body["start_time"]["number"] > 0
    [r] = rest.reservations()
    assert r.name == "gpufleet-check-n-1" and r.nodes == ("gpu-a-0", "gpu-a-1") and "MAINT" in r.flags
    rest.delete_reservation("gpufleet-check-n-1")
    rest.delete_reservation("gpufleet-check-n-1")  # gone already: what was asked
    assert rest.reservations() == []


def test_the_jobs_slurm_failed_off_a_node_are_read_from_accounting_each_run_its_own_record():
    """GET /slurmdb/v0.0.45/jobs/ with node, state=NODE_FAIL, start_time and show_duplicates (slurm-26-05-3-1
    src/plugins/data_parser/v0.0.45/parsers.c JOB_CONDITION, JOB_CONDITION_FLAGS): a requeued job has a record per
    run; only the run that ended NODE_FAIL on the node counts."""
    asked: list[httpx.URL] = []

    def answer(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/openapi/v3":
            return httpx.Response(200, json={"paths": {"/slurm/v0.0.45/ping/": {}}})
        asked.append(req.url)
        return httpx.Response(200, json={"jobs": [
            {"job_id": 7, "name": "train", "nodes": "gpu-a-[0-1]", "state": {"current": ["NODE_FAIL"]}},
            {"job_id": 7, "name": "train", "nodes": "None assigned", "state": {"current": ["PENDING"]}},
            {"job_id": 8, "name": "other", "nodes": "gpu-b-0", "state": {"current": ["NODE_FAIL"]}},
        ]})

    rest = SlurmREST("http://slurmrestd", _Tokens(), transport=httpx.MockTransport(answer))
    [j] = rest.jobs_failed_on(["gpu-a-1"], 1796126400.0)
    assert (j.job_id, j.state, j.nodes) == (7, "NODE_FAIL", ("gpu-a-0", "gpu-a-1"))
    (url,) = asked
    assert url.path == "/slurmdb/v0.0.45/jobs/"
    params = dict(url.params)
    assert int(params.pop("end_time")) > time.time()  # slurmdbd matches the state within the window: an end is needed
    assert params == {"node": "gpu-a-1", "state": "NODE_FAIL", "start_time": "1796126400", "show_duplicates": "true",
                      "skip_steps": "true"}
    assert rest.jobs_failed_on([], 0) == [] and len(asked) == 1  # nothing to ask
