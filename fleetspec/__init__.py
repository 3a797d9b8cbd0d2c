"""The declarative fleet spec shared by the components, the reconciler and the policies.

Pydantic only: importing it never pulls in pulumi or kubernetes.
"""
from .load import CONFIG_KEY, SpecError, StackFile, load_document, load_stack_file, parse_fleet, stack_file
from .models import FleetSpec, HealingSpec, NodePool, Partition, SlurmSpec, StorageSpec

__all__ = [
    "CONFIG_KEY", "SpecError", "StackFile", "load_document", "load_stack_file", "parse_fleet", "stack_file",
    "FleetSpec", "HealingSpec", "NodePool", "Partition", "SlurmSpec", "StorageSpec",
]
