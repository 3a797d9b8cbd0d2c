"""A person's decision about what gpufleet holds (issue 23 item 7), as the on-call commands write it.

`gpufleet release | return | retire | mark-healthy` write one `PersonRequest` as an annotation
(`gpufleet.io/request`) on the node's Remediation; the reconciler carries it out (fenced by its Lease,
with the Slurm and provider calls only it makes), notes its id in the record's status as done, with
what it did, and the command waits for that. The annotation is the person's; the status the
reconciler's: neither writes the other's.

- release: a remediation held by the brake or max_concurrent is admitted (the gate passed over by a
  person); an escalated or opted-out one goes on to be replaced and repaired.
- return: a node out of service (its repair stopped, retired, or never begun) is health-checked and,
  when it passes, goes back to the spares.
- retire: out for good, now.
- mark-healthy: a person's override: no check; back where it belongs (in service when its Slurm node
  still runs there, else among the spares), its own Slurm drains lifted, the record ended.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

RELEASE, RETURN, RETIRE, MARK_HEALTHY = "release", "return", "retire", "mark-healthy"
ACTIONS = (RELEASE, RETURN, RETIRE, MARK_HEALTHY)


@dataclass(frozen=True)
class PersonRequest:
    action: str
    by: str
    at: datetime
    reason: str = ""

    @property
    def id(self) -> str:
        """One decision: a person asking again (a new time) is a new request; the same write read twice is not."""
        return f"{self.action}@{self.at.isoformat()}"

    def dumps(self) -> str:
        return json.dumps({"action": self.action, "by": self.by, "at": self.at.isoformat(), "reason": self.reason[:500]})


def parse(text: str | None) -> PersonRequest | None:
    """The request, or None when there is none or it does not read (the reconciler reports that)."""
    if not text:
        return None
    try:
        d = json.loads(text)
        if d["action"] not in ACTIONS:
            return None
        return PersonRequest(d["action"], str(d.get("by") or "?"),
                             datetime.fromisoformat(str(d["at"]).replace("Z", "+00:00")), str(d.get("reason") or ""))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
