"""Fixtures with real parts for the integration tests: a local control plane (kube_cluster) and its client with
Remediations served (api), a local Slurm (slurm_cluster and its clients), the images."""
from tests.fixtures.images import built_images  # noqa: F401
from tests.fixtures.kube_cluster import kube_bin_dir, kube_cluster, pytest_collection_modifyitems  # noqa: F401
from tests.fixtures.reconciler_kube import api  # noqa: F401
from tests.fixtures.slurm_cluster import slurm_cli, slurm_cluster, slurm_fresh, slurm_rest  # noqa: F401
