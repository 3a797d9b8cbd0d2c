"""Fixtures with real parts for the end-to-end tests: the Pulumi engine and the Slurm root, a local
control plane, the images, and the reconciler's pods in the local environment."""
from tests.fixtures.engine import pulumi_bin_dir, slurm_root  # noqa: F401
from tests.fixtures.images import built_images  # noqa: F401
from tests.fixtures.kube_cluster import kube_bin_dir, kube_cluster, pytest_collection_modifyitems  # noqa: F401
from tests.fixtures.local_pods import kubectl, local_pods  # noqa: F401
