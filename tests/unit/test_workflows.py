"""The GitHub workflows: actions pinned by commit, no credential within reach of a pull request, images
signed with their SBOM and provenance, dependencies installed from the hash-checked lock files."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def load(name: str) -> dict:
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as True
    return doc


def steps(job: dict) -> list[dict]:
    return job.get("steps") or []


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_by_a_commit(path):
    doc = yaml.safe_load(path.read_text())
    uses = [s["uses"] for j in doc["jobs"].values() for s in steps(j) if "uses" in s]
    assert uses
    for u in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}", u), f"{path.name}: {u} is not pinned by a commit"
    # each pin says which tag it was read at
    text = path.read_text()
    for sha in {u.split("@")[1] for u in uses}:
        assert re.search(rf"@{sha}\s+#\s+v\d", text), f"{path.name}: {sha} has no tag comment"


def test_pull_requests_get_no_credentials():
    doc = load("gitops.yml")
    assert "pull_request_target" not in doc["on"]  # that one runs with the base's secrets: never
    assert doc["permissions"] == {}
    for name, job in doc["jobs"].items():
        text = yaml.safe_dump(job)
        if "pull_request" in str(job.get("if", "")):
            assert "secrets." not in text, f"job {name} runs on pull requests and reads a secret"
            assert "environment" not in job
            preview = next(s for s in steps(job) if s.get("id") == "preview")
            assert "--scratch" in preview["run"]
    # what holds credentials runs only for a push to main, in a GitHub environment with reviewers
    for name, job in doc["jobs"].items():
        if "secrets." in yaml.safe_dump(job):
            assert "github.event_name == 'push'" in job["if"] and job["environment"], name


def test_checkout_keeps_no_token():
    for path in WORKFLOWS:
        doc = yaml.safe_load(path.read_text())
        for j in doc["jobs"].values():
            for s in steps(j):
                if s.get("uses", "").startswith("actions/checkout@"):
                    assert s["with"]["persist-credentials"] is False, path.name


def test_release_signs_attests_and_records_every_digest():
    doc = load("release.yml")
    job = doc["jobs"]["images"]
    assert job["permissions"]["id-token"] == "write" and job["permissions"]["attestations"] == "write"
    runs = "\n".join(s.get("run", "") for s in steps(job))
    assert 'cosign sign --yes "$ref"' in runs and "cosign attest --yes --type spdxjson" in runs
    uses = [s.get("uses", "") for s in steps(job)]
    assert sum(u.startswith("anchore/sbom-action@") for u in uses) == 2
    assert sum(u.startswith("actions/attest-build-provenance@") for u in uses) == 2
    assert "fleet.slurm.image_digests.$name" in runs  # the Slurm images' digests, for prod's images-pinned
    assert "--require-hashes" in runs
    deploy = load("gitops.yml")["jobs"]["deploy"]
    assert any("cosign verify" in s.get("run", "") for s in steps(deploy))


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_installs_come_from_the_lock_file(path):
    for line in path.read_text().splitlines():
        if "pip install" in line:
            assert "--require-hashes" in line or "--no-deps" in line, line


def test_a_release_is_only_of_a_commit_on_main():
    """A `v*` tag on an unreviewed commit releases nothing: a job without secrets refuses a tag that is not vX.Y.Z
    or whose commit main does not contain, and the job that asks the release environment for its secrets needs
    it. The tagged commit brings its own copy of release.yml, so the deploy (gitops.yml, main's copy) checks
    again: the image's revision is on main and the signature's certificate names that commit."""
    doc = load("release.yml")
    assert doc["on"] == {"push": {"tags": ["v*"]}}
    gate = doc["jobs"]["provenance"]
    assert "environment" not in gate and "secrets." not in yaml.safe_dump(gate)
    assert gate["permissions"] == {"contents": "read"}
    checkout = next(s for s in steps(gate) if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0  # main's history, to ask whether it contains the commit
    runs = "\n".join(s.get("run", "") for s in steps(gate))
    assert 'git merge-base --is-ancestor "$GITHUB_SHA" origin/main' in runs
    assert r"^v[0-9]+\.[0-9]+\.[0-9]+$" in runs
    # every job that reads a secret or signs waits for the gate
    for name, job in doc["jobs"].items():
        if name != "provenance":
            assert "provenance" in ([job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", [])), name
    build = "\n".join(s.get("run", "") for s in steps(doc["jobs"]["images"]))
    assert '--label "org.opencontainers.image.revision=$GITHUB_SHA"' in build
    deploy = load("gitops.yml")["jobs"]["deploy"]
    checkout = next(s for s in steps(deploy) if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0
    verify = next(s["run"] for s in steps(deploy) if "cosign verify" in s.get("run", ""))
    assert 'git merge-base --is-ancestor "$rev" origin/main' in verify
    assert '--certificate-github-workflow-sha "$rev"' in verify and "--certificate-github-workflow-trigger push" in verify
    assert "refs/tags/v[0-9]+[.][0-9]+[.][0-9]+$" in verify  # the whole tag, not any name starting with v
