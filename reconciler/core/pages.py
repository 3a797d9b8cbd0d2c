"""What the pages say: what gpufleet did, what it will do, and whether a person must act. Pure text.

The first page of a fault goes out when it is cordoned, before anything else (containment's page timing):
at that moment admission has not weighed it (the storm brake counts faults that are still arriving, and
waits `admission_hold_seconds` for them), so the page promises no replacement. It says replacement follows
unless admission holds the node, and that a hold which needs a person pages again: the storm brake (one page
per pool and storm), the attempt cap (escalated). Those pages say what is left undone (the Slurm nodes the
pool runs short) and what the person should do. A hold that needs nobody (`max_concurrent`: it waits its
turn) sends no page; the record says it.
"""
from __future__ import annotations

from gpufleet.fleetspec import FleetSpec, labels
from gpufleet.fleetspec.faults import Kind, describe
from gpufleet.fleetspec.faults.catalogue import XIDS

from gpufleet.reconciler.core.model import Admission, NodeView, Remediation

# What NVIDIA GPU Feature Discovery labels a node with (github.com/NVIDIA/k8s-device-plugin, docs/gpu-feature-
# discovery: nvidia.com/cuda.driver-version.full, and before it nvidia.com/cuda.driver.major/.minor/.rev;
# nvidia.com/gpu.product): where a node carries them, the vendor case says them.
GFD_DRIVER = "nvidia.com/cuda.driver-version.full"
GFD_DRIVER_PARTS = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")
GFD_PRODUCT = "nvidia.com/gpu.product"
# What a person asks the driver for where the labels do not say it (nvidia-smi -q's "Serial Number", "Driver
# Version", "GPU UUID"; nvidia-bug-report.sh is what NVIDIA's support asks to be attached).
ASK_ON_THE_NODE = "nvidia-smi -q{gpu} | grep -E 'Serial Number|Driver Version|GPU UUID|Bus Id'; nvidia-bug-report.sh"


def _slurm(r: Remediation) -> str:
    names = [n for n in r.slurm_nodes if n not in r.kept_drains]
    return f"{len(names)} Slurm node(s) ({', '.join(names)})" if names else "no Slurm node"


def detected(r: Remediation, spec: FleetSpec) -> str:
    grace = spec.healing.grace_period_seconds
    jobs = (f"running jobs get SIGTERM and {grace}s to checkpoint, then are requeued" if grace
            else "running jobs are requeued")
    if r.kind is Kind.NODE_LOST:  # core/node_lost.py: no slurmd there to deliver a SIGTERM
        jobs = "its jobs cannot checkpoint: Slurm requeues a --requeue job once it marks the node DOWN, gpufleet the rest"
    d = r.diagnosis
    said = f" Diagnosed while it served: {d.message}; it needs {d.needs}." if d is not None and d.needs else ""
    return (f"{r.node} ({r.pool}): {describe(r.xid, r.kind)} - {r.message}.{said} gpufleet has cordoned it and drains it "
            f"in Slurm ({jobs}). Then a spare of {r.pool} replaces it, unless the storm brake or the attempt cap "
            "holds it for a person, which pages again. No action needed now.")


def spare_quarantined(r: Remediation, refill_asked: bool) -> str:
    then = "a refill is requested" if refill_asked else "no refill: the node provider has no room (a further page)"
    return (f"spare {r.node} ({r.pool}) reported {describe(r.xid, r.kind)}: quarantined, nothing ran there; {then}. "
            "No action needed.")


def escalated(r: Remediation, a: Admission, spec: FleetSpec) -> str:
    policy = spec.healing
    spares = (f"although {a.free_spares} spare(s) are free" if a.free_spares else "and no spare is free")
    return (f"{r.node} ({r.pool}) faulted again: {a.attempts + 1} remediations within "
            f"{policy.attempts_window_seconds}s (max {policy.max_attempts_per_node}), so gpufleet does not replace it. "
            f"It stays cordoned, drained in Slurm and quarantined: pool {r.pool} runs {_slurm(r)} short, {spares}. "
            f"Action needed: repair {r.node} and return it (`gpufleet mark-healthy {r.node}` after its health check), "
            f"or retire it and add a node to the pool; remediation {r.name}.")


def no_spare(r: Remediation, can_refill: bool, asked: bool = True, in_place: bool = False) -> str:
    """`asked`: a node was asked for (else the pool's standing requests cover what it lacks); `in_place`: the
    node is repaired meanwhile and takes its job back if the repair holds."""
    repair = (f" {r.node} itself is repaired in place meanwhile and takes its job back if the repair holds;"
              if in_place else "")  # before the last sentence, which says whether a person must act
    if not can_refill:
        then = (f"the node provider has no room for another node (a failed refill, asked again with backoff). "
                f"Action needed: add capacity to pool {r.pool}; gpufleet replaces {r.node} once a spare joins.")
    elif asked:
        then = (f"capacity is requested, and gpufleet replaces {r.node} as soon as a spare joins (a refill that fails "
                "pages). No action needed now.")
    else:
        then = (f"the pool's standing capacity requests cover it, and gpufleet replaces {r.node} as soon as a spare "
                "joins. No action needed now.")
    return (f"no spare left in pool {r.pool} for {r.node}: it stays cordoned and drained in Slurm, the pool runs "
            f"{_slurm(r)} short;{repair} {then}")


def failed(r: Remediation, reason: str) -> str:
    return (f"remediation {r.name} of {r.node} ({r.pool}) failed: {reason}. gpufleet takes no further step: "
            f"{r.node} stays cordoned and drained in Slurm. Action needed: see why (`kubectl describe remediation "
            f"{r.name}`), then repair {r.node} and return it (`gpufleet mark-healthy {r.node}` after its health "
            "check) or retire it.")


def sources(a: Admission) -> str:
    """Who reported the unhealthy nodes' faults, grouped by reporter (the condition's field manager), and a
    warning when one writer other than the nodes' own agents reported several: a burst one source could forge.
    (An agent writes only its own node's conditions: components/admission.py.)"""
    by: dict[str, list[str]] = {}
    for node, who in a.reporters:
        by.setdefault(who, []).append(node)
    if not by:
        return "no reporter seen"
    said = "; ".join(f"{writer(who)} on {', '.join(sorted(nodes))}" for who, nodes in sorted(by.items()))
    single = [who for who, nodes in by.items() if len(nodes) > 1 and who not in ("", labels.MANAGER_AGENT)]
    warn = (f"; {' and '.join(sorted(single))} alone reported faults on several nodes: check they are real before "
            "returning them (a burst one writer reports could be forged)") if single else ""
    return f"reported by {said}{warn}"


WRITERS = {labels.MANAGER_AGENT: "the node agent", labels.MANAGER_INJECT_FAULT: "a person (gpufleet inject-fault)",
           labels.MANAGER_RECONCILER: "the reconciler"}


def writer(manager: str) -> str:
    """A field manager in words: gpufleet's own by what they are, another detector by its name."""
    if not manager:
        return "an unknown writer"
    return f"{WRITERS[manager]} ({manager})" if manager in WRITERS else manager


def storm(message: str, pool: str) -> str:
    return (f"{message}. Action needed: look for what the faults of pool {pool} share (a driver or firmware "
            "roll-out, a rack, a switch, the power); the held nodes are replaced once the pool's unhealthy "
            "fraction (nodes out for a fault now: contained, replaced, or quarantined and not yet repaired) falls back "
            "under healing.max_unhealthy_fraction "
            f"(`kubectl get rem -l gpufleet.io/pool={pool}` lists them).")


# --- a person's case: the faults NVIDIA sends to support, a person or the machine's mechanics --------------

def nvidia_bucket(r: Remediation) -> str:
    """NVIDIA's immediate action for the fault (CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW), or the
    escalation rule that made it one (the condition's message says it, after `[NVIDIA: `)."""
    said = r.message.rpartition("[NVIDIA: ")[2].rstrip("]") if "[NVIDIA: " in r.message else ""
    if said:
        return said
    e = XIDS.get(r.xid) if r.kind is Kind.XID else None
    return e.nvidia if e is not None and e.nvidia else "CONTACT_SUPPORT"


def _driver(node: NodeView) -> str:
    full = node.label(GFD_DRIVER)
    if full:
        return full
    parts = [node.label(k) for k in GFD_DRIVER_PARTS]
    return ".".join(p for p in parts if p) if all(parts) else ""


def vendor_case(r: Remediation, node: NodeView, rule: str = "") -> str:
    """The vendor-case page: the facts a vendor asks for where gpufleet has them (the GPU's PCI address, the
    driver's version and the GPU model from GPU Feature Discovery's labels, the machine, the driver's own
    lines), and what to collect on the node where it does not (the serial number)."""
    bucket = rule or nvidia_bucket(r)
    what = {"CHECK_MECHANICALS": "check the machine's mechanics (NVIDIA: CHECK_MECHANICALS)",
            "UPDATE_SWFW": "update its software or firmware (NVIDIA: UPDATE_SWFW)"}.get(
        bucket, f"open a case with the vendor ({'escalation rule ' if rule else 'NVIDIA: '}{bucket})")
    facts = [f"GPU PCI address: {r.pci or 'not named by the fault'}"]
    facts.append(f"driver version: {_driver(node) or 'not labelled (ask the node)'}")
    if node.label(GFD_PRODUCT):
        facts.append(f"GPU model: {node.label(GFD_PRODUCT)}")
    if node.provider_id:
        facts.append(f"machine: {node.provider_id}")
    if node.boot_id:
        facts.append(f"boot id: {node.boot_id}")
    facts.append(f"the driver's lines: {r.message}")
    ask = ASK_ON_THE_NODE.format(gpu=f" -i {r.pci}" if r.pci else "")
    return (f"{r.node} ({r.pool}): {describe(r.xid, r.kind)} needs a person: {what}. It is cordoned and held "
            f"(quarantined; the machine is kept as it failed, never retired or terminated by gpufleet); its jobs "
            f"were moved to a spare. Case facts: {'; '.join(facts)}. For the serial number and the full report, "
            f"on the node: {ask}. Action needed: {what}; then `gpufleet return {r.node}` (checked before it "
            f"serves) or `gpufleet retire {r.node}`.")
