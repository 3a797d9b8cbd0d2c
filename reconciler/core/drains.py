"""Who owns a drain in Slurm: decided by who set its reason, as Slurm records it, and what it says.

Slurm records the user who set a node's reason (`reason_set_by_user` in slurmrestd's node data, the
`[user@time]` of `scontrol show node`; `slurm_reasons.py` says where Slurm writes it and for whom):
- a reason set by any user other than gpufleet's and Slurm's own (the SlurmUser, root) is a person's,
  whatever its text (a person who types `gpufleet: ...` still holds the node);
- gpufleet's fault drains start with `gpufleet:`, its lending drains with `gpufleet-lending:`, both set by the
  reconciler's Slurm user (`slurm.reconciler_user`, or the uid the CLI backend's scontrol runs as) or by root or
  the SlurmUser (accounts gpufleet may act as; slurmctld also records itself when it appends its own reason,
  " : Not responding"); the operator's start with `slurm-operator:`, set by its client's user or its preStop's
  root (Slurm's own users);
- a reason Slurm's own users set is Slurm's own (a fault of its own kind, `slurm_reasons.REASONS`: a
  "Kill task failed" is a node to check, "Not responding" a node that is gone) when every piece of it is a
  reason Slurm's daemons write; anything else they set is a person's (root and the SlurmUser are also
  accounts a person can use).
When Slurm did not name the setter (a backend that cannot tell, a uid slurmrestd cannot name), the prefix
decides as it always did and any other drain is a person's: never changed, never lifted.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import describe
from gpufleet.fleetspec.models import SLURM_USER, FleetSpec

from gpufleet.reconciler.core.model import Remediation, Setter, SlurmNodeView
from gpufleet.reconciler.core.slurm_reasons import SLURMD_USER, SlurmReason, nameless, slurms_own_text


class Owner(str, Enum):
    GPUFLEET = "gpufleet"  # a fault's drain
    LENDING = "gpufleet-lending"  # an idle node drained to be lent
    OPERATOR = "slurm-operator"
    SLURM = "slurm"  # slurmctld's or slurmd's own
    PERSON = "person"


@dataclass(frozen=True)
class SlurmUsers:
    """The Slurm users whose reasons are not a person's: gpufleet's, and those Slurm's daemons run as."""

    gpufleet: frozenset[str]
    slurm: frozenset[str]

    @classmethod
    def of(cls, spec: FleetSpec, acts_as: str | None = None) -> "SlurmUsers":
        """The spec's `slurm.reconciler_user` (and `acts_as`, the user the Slurm client acts as when it is not
        that: the CLI backend's uid); the SlurmUser the stack's slurm.conf names (Slinky's: `slurm`,
        gpufleet.fleetspec.models.SLURM_USER) and root, slurmd's."""
        return cls(frozenset({spec.slurm.reconciler_user} | ({acts_as} if acts_as else set())),
                   frozenset({SLURM_USER, SLURMD_USER}))

    def setter(self, user: str | None) -> Setter | None:
        """Who Slurm says set a reason, as the fleet knows them; None when Slurm did not name one."""
        if nameless(user):
            return None
        assert user is not None
        user = user.strip()
        return Setter(user, gpufleet=user in self.gpufleet, slurm=user in self.slurm)


def slurm_reason(remediation: Remediation) -> str:
    return f"{labels.SLURM_REASON_PREFIX} {describe(remediation.xid, remediation.kind)} [{remediation.name}]"


def lending_reason(node: str) -> str:
    return f"{labels.SLURM_LENDING_PREFIX} idle, lent to preemptible work [{node}]"


def _out(n: SlurmNodeView) -> bool:
    return n.drained or n.down


def _claimed(reason: str) -> Owner | None:
    """Whose the reason's text says it is (its prefix)."""
    if reason.startswith(labels.SLURM_LENDING_PREFIX):
        return Owner.LENDING
    if reason.startswith(labels.SLURM_REASON_PREFIX):
        return Owner.GPUFLEET
    if reason.startswith(labels.SLINKY_REASON_PREFIX):
        return Owner.OPERATOR
    return None


def owner(n: SlurmNodeView) -> Owner:
    """Whose the node's reason is (see the module docstring)."""
    claim, by = _claimed(n.reason), n.set_by
    if by is None:
        return claim or Owner.PERSON
    if claim in (Owner.GPUFLEET, Owner.LENDING):
        # gpufleet's user, or a super-user account gpufleet may act as (root or the SlurmUser: the CLI backend
        # runs scontrol as the reconciler's own uid; a local reconciler may hold the SlurmUser's token)
        return claim if by.gpufleet or by.slurm else Owner.PERSON
    if claim is Owner.OPERATOR:
        return claim if by.slurm else Owner.PERSON
    return Owner.SLURM if by.slurm and slurms_own_text(n.reason) else Owner.PERSON


def drained_by_gpufleet(n: SlurmNodeView) -> bool:
    return _out(n) and owner(n) is Owner.GPUFLEET


def drained_by_operator(n: SlurmNodeView) -> bool:
    return _out(n) and owner(n) is Owner.OPERATOR


def drained_for_lending(n: SlurmNodeView) -> bool:
    """An idle node gpufleet drained to lend it (reconciler/core/lending.py)."""
    return _out(n) and owner(n) is Owner.LENDING


def drained_by_slurm(n: SlurmNodeView) -> SlurmReason | None:
    """Slurm's own drain or down (slurmctld's, slurmd's): its row in `slurm_reasons.REASONS` (what it means,
    what gpufleet does), or None."""
    return slurms_own_text(n.reason) if _out(n) and owner(n) is Owner.SLURM else None


def drained_by_person(n: SlurmNodeView) -> bool:
    """A drain a person set (see the module docstring): never changed, never lifted."""
    return n.drained and owner(n) is Owner.PERSON


def set_by(n: SlurmNodeView) -> str:
    """Who set the reason, for a person to read ('' when Slurm did not say)."""
    return f", set by {n.set_by.user}" if n.set_by is not None else ""
