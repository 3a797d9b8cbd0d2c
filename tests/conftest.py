"""Fixtures with real parts: a local control plane (kube_cluster), a local Slurm (slurm_cluster),
the Pulumi engine (pulumi_bin_dir) and the Slurm 26.05 root (slurm_root)."""
pytest_plugins = ["tests.fixtures.kube_cluster", "tests.fixtures.slurm_cluster", "tests.fixtures.engine",
                  "tests.fixtures.images", "tests.fixtures.local_pods"]
