"""The local stack applied by the real engine (server-side apply) to a real API server: gpufleet's
Slinky CRDs take every Slurm resource the stack declares, the reconciler's Token included, and the
reconciler's ServiceAccount, checksum and token mount arrive as declared."""
from __future__ import annotations

import pytest
import yaml
from kubernetes import client

from gpufleet.fleetspec import labels, load_stack_file
from gpufleet.paths import PROJECT_DIR
from gpufleet.preview import scratch_stack
from localenv import stack_config

pytestmark = pytest.mark.e2e


def test_local_stack_applies_its_slinky_resources(kube_cluster, pulumi_bin_dir, tmp_path):
    spec = load_stack_file(PROJECT_DIR / "Pulumi.local.yaml").fleet
    for i in range(spec.healing.reconciler.replicas):  # one per replica: the replicas' hostPort takes a node each
        kube_cluster.create_fake_node(f"apply-system-{i}", labels={labels.ROLE: labels.ROLE_SYSTEM, labels.SYSTEM_NODE: "true"})
    with scratch_stack("local", spec.secret_keys()) as st:
        # What the local environment supplies: this control plane's kubeconfig and address, the built images.
        cfg = st.project_dir / "Pulumi.local.yaml"
        doc = yaml.safe_load(cfg.read_text())
        doc["config"][stack_config.KEY] = stack_config.local_environment(
            kube_cluster.kubeconfig_path, kube_cluster.apiserver_port, None)
        cfg.write_text(yaml.safe_dump(doc))
        try:
            proc = st.run("up", "--yes", "--skip-preview", "--color", "never", capture=True, check=False, timeout=600)
            assert proc.returncode == 0, (proc.stdout or "")[-4000:] + (proc.stderr or "")[-2000:]
            api = kube_cluster.api_client()
            objs = client.CustomObjectsApi(api)
            got = {(kind, o["metadata"]["name"]) for kind in ("nodesets", "loginsets", "controllers", "restapis", "tokens")
                   for o in objs.list_cluster_custom_object("slinky.slurm.net", "v1beta1", kind)["items"]}
            assert {("tokens", "gpufleet-reconciler"), ("restapis", "slurm"), ("controllers", "slurm"),
                    ("loginsets", "login"), ("nodesets", "h100"), ("nodesets", "l40s")} <= got
            login = objs.get_namespaced_custom_object("slinky.slurm.net", "v1beta1", "slurm", "loginsets", "login")
            assert login["spec"]["sssdConfRef"] == {"name": "slurm-sssd-conf", "key": "sssd.conf"}
            # with the key it is minted from, in the Slurm namespace (components/slinky.py)
            token = objs.get_namespaced_custom_object("slinky.slurm.net", "v1beta1", "slurm", "tokens",
                                                      "gpufleet-reconciler")
            assert token["spec"]["secretRef"]["name"] == "gpufleet-reconciler-slurm-token"
            dep = client.AppsV1Api(api).read_namespaced_deployment("gpufleet-reconciler", "gpufleet-system")
            assert len(dep.spec.template.metadata.annotations["gpufleet.io/config-checksum"]) == 64
        finally:  # the control plane is shared with other tests: leave none of this stack's objects behind
            st.run("destroy", "--yes", "--skip-preview", capture=True, check=False, timeout=600)
