"""Stand-in for the pod of the stack's SlurmUsers Job (components/slinky.py `_slurm_users`) in the local
environment, where Slinky's slurmctld image, which the Job's container runs, cannot run.

It does what that pod does: the script the Job mounts from its ConfigMap (`slurm_users_script`: sacctmgr adds the
reconciler's Slurm user with its AdminLevel, idempotently) runs as the SlurmUser, as the Job's securityContext
says, in the Slurm root against the local slurmctld and slurmdbd. Like a Job with `restartPolicy: OnFailure`,
it is tried again until it succeeds (slurmdbd or the cluster's registration may not be there yet), then once
for each new Job (a replaced Job is a new uid). The Job object itself stays as the API server keeps it (its pod,
where the system nodes cannot pull the image, never runs).
"""
from __future__ import annotations

import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from localenv.slurm import SLURM_USER, LocalSlurm

log = logging.getLogger("slurm-users-job")

COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "slurm-users"  # components/slinky.py: metadata(SLURM_USERS, "slurm-users", ...)


def script_of(job: Any, core: client.CoreV1Api, namespace: str) -> str | None:
    """The script the Job's container runs: its command's file, from the ConfigMap volume mounted at its folder."""
    spec = job.spec.template.spec
    container = spec.containers[0]
    path = (container.command or [""])[-1]
    folder, _, name = path.rpartition("/")
    mount = next((m for m in container.volume_mounts or [] if m.mount_path.rstrip("/") == folder), None)
    volume = next((v for v in spec.volumes or [] if mount is not None and v.name == mount.name), None)
    if volume is None or volume.config_map is None:
        return None
    try:
        cm = core.read_namespaced_config_map(volume.config_map.name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return (cm.data or {}).get(name)


def run_script(slurm: LocalSlurm, script: str):
    """The Job's script as its container runs it: as the SlurmUser (the Job's securityContext), in the Slurm
    root, with this cluster's slurm.conf (as the daemons see it: the SlurmUser may not enter the work dir's
    parents)."""
    return slurm.run(["runuser", "-u", SLURM_USER, "--", "env", f"SLURM_CONF={slurm.daemon_conf}", "sh", "-c", script],
                     timeout=60)


def run_pending(batch: client.BatchV1Api, core: client.CoreV1Api, slurm: LocalSlurm, namespace: str,
                done: set[str]) -> None:
    """Run the script of each SlurmUsers Job whose uid is not in `done`; add those that succeed."""
    try:
        jobs = batch.list_namespaced_job(namespace, label_selector=f"{COMPONENT_LABEL}={COMPONENT}").items
    except ApiException as e:
        if e.status == 404:
            return
        raise
    for job in jobs:
        if job.metadata.uid in done or job.metadata.deletion_timestamp is not None:
            continue
        if not slurm.accounting:
            log.info("job %s: waiting for slurmdbd (no Accounting applied yet)", job.metadata.name)
            continue
        script = script_of(job, core, namespace)
        if script is None:
            log.info("job %s: its script's ConfigMap is not there yet", job.metadata.name)
            continue
        r = run_script(slurm, script)
        out = (r.stdout + r.stderr).strip()
        if r.returncode == 0:
            done.add(job.metadata.uid)
            log.info("job %s: done: %s", job.metadata.name, out.splitlines()[-1] if out else "")
        else:
            log.warning("job %s: failed (%s), tried again next pass: %s", job.metadata.name, r.returncode, out[-500:])
