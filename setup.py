"""Installs one package, ``gpufleet``, from the repository's folders.

The repository keeps its layout (``fleetspec/``, ``reconciler/``, ``components/``, ``policies/`` beside
``gpufleet/``), but a user's own Pulumi program very likely has a ``components`` or ``policies`` package of its
own, so nothing is installed under those names: each folder becomes ``gpufleet.<folder>`` (setuptools'
``package_dir``), and every import says so. Project metadata stays in pyproject.toml.
"""
from setuptools import find_packages, setup

FOLDERS = ("fleetspec", "reconciler", "components", "policies")

packages = ["gpufleet", *(f"gpufleet.{p}" for p in find_packages(include=["gpufleet.*"]))]
package_dir = {"gpufleet": "gpufleet"}
for folder in FOLDERS:
    for sub in [folder, *find_packages(include=[f"{folder}.*"])]:
        packages.append(f"gpufleet.{sub}")
        package_dir[f"gpufleet.{sub}"] = sub.replace(".", "/")

setup(packages=packages, package_dir=package_dir,
      package_data={"gpufleet.policies": ["PulumiPolicy.yaml", "config/*"]})
