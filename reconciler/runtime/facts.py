"""Observation: what a step of a remediation, or a lending pass, needs to see, read from the caches and
Slurm. The core says what that is (`decide.needs`); this module gathers it and decides nothing.

Facts counted across nodes (admission, the spares taken elsewhere) are completed under the claims lock
by `shared`, with the steps being applied; everything else, Slurm included, is read outside it.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable, Iterable

from gpufleet.fleetspec.models import FleetSpec, NodePool

from gpufleet.reconciler.adapters.providers import NodeProvider
from gpufleet.reconciler.adapters.slurm import SlurmClient, SlurmError, SlurmNode, call
from gpufleet.reconciler.core import admission, lending, refills, resume, signals
from gpufleet.reconciler.core.drains import SlurmUsers
from gpufleet.reconciler.core.model import JobView, Needs, PendingJob, Remediation, SlurmNodeView, StepFacts, Stock
from gpufleet.reconciler.core.observe import evictable_views
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.slurm_names import comment_node, slurm_nodes_on
from gpufleet.reconciler.errors import TemporaryError
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.claims import Claims

log = logging.getLogger(__name__)


def slurm_view(n: SlurmNode, users: SlurmUsers) -> SlurmNodeView:
    return SlurmNodeView(n.name, frozenset(n.states), n.reason, comment_node(n.comment or ""),
                         partitions=tuple(n.partitions),
                         last_busy=datetime.fromtimestamp(n.last_busy, timezone.utc) if n.last_busy else None,
                         set_by=users.setter(n.reason_set_by),
                         reason_at=datetime.fromtimestamp(n.reason_changed_at, timezone.utc) if n.reason_changed_at
                         else None)


class Facts:
    def __init__(self, spec: FleetSpec, caches: Caches, slurm: SlurmClient | None,
                 providers: dict[str, NodeProvider], claims: Claims, clock: Callable[[], datetime]):
        self.spec, self.caches, self.slurm, self.providers = spec, caches, slurm, providers
        self.claims, self.clock = claims, clock
        # whose Slurm reasons are not a person's (core/drains.py); the CLI backend acts as the process's own user
        self.users = SlurmUsers.of(spec, getattr(slurm, "acts_as", None))

    # --- one step of one remediation -------------------------------------------------------------------

    def observe(self, r: Remediation, need: Needs) -> StepFacts:
        """What `need` asks for that is not counted across nodes (it may call Slurm)."""
        c = self.caches
        f = StepFacts()
        if need.slurm_names:
            f = replace(f, slurm_names=slurm_nodes_on(r.node, c.pods_on(r.node)).names)
        if need.slurm_nodes:
            f = replace(f, slurm=self._slurm_views(need.slurm_nodes))
        if need.jobs_on:
            f = replace(f, jobs_on_node=self._jobs(need.jobs_on))
        if need.failed_on and need.failed_since is not None:
            f = replace(f, failed_jobs=self._failed(need.failed_on, need.failed_since))
        if need.pods:
            f = replace(f, pods=tuple(c.pods_on(r.node)), node=c.nodes.get(r.node))
        if need.spares:
            nodes = tuple(sorted(c.nodes.by_index("pool", r.pool), key=lambda n: n.name))
            on_spares = tuple((n.name, self._slurm_views(slurm_nodes_on(n.name, c.pods_on(n.name)).names))
                              for n in nodes if n.is_spare)
            f = replace(f, pool_nodes=nodes, spare_slurm=on_spares)
        if need.replacement and r.replacement:
            f = replace(f, replacement=c.nodes.get(r.replacement), replacement_pods=tuple(c.pods_on(r.replacement)))
        if need.slurm_pods or need.replacement_slurm:
            f = replace(f, slurm_pods=tuple(p for n in r.slurm_nodes for p in c.pods.by_index("slurm", n)),
                        node=c.nodes.get(r.node))
        if need.replacement_slurm and r.replacement:
            on = slurm_nodes_on(r.replacement, c.pods_on(r.replacement)).names
            f = replace(f, replacement_slurm=on, slurm=self._slurm_views(set(on) | set(resume.moved(r, f))))
        if need.can_refill:
            refusal = self.refusal(r.pool)
            f = replace(f, can_refill=not refusal, refusal=refusal, stock=self.stock(r))
        return f

    def stock(self, r: Remediation) -> Stock | None:
        """The pool's spares against its declaration, as `r` weighs a refill (the remediations being applied
        counted too, so two workers do not both ask for the pool's one missing node)."""
        pool = next((p for p in self.spec.pools if p.name == r.pool), None)
        if pool is None:
            return None
        seen = {x.name: x for x in self.caches.remediations_in({r.pool})}
        seen.update({x.name: x for x in self.claims.applying() if x.pool == r.pool})
        return refills.stock(pool, self.caches.nodes.by_index("pool", r.pool), seen.values(), r, self.spec,
                             self.clock())

    def shared(self, r: Remediation, need: Needs, observed: StepFacts) -> StepFacts:
        """The facts counted across nodes, with the steps being applied. Call it under `claims.lock`."""
        pools = {p.name for p in self.spec.pools}
        seen = {x.name: x for x in self.caches.remediations_in(pools)}
        seen.update({x.name: x for x in self.claims.applying()})
        f = observed
        if need.admission:
            f = replace(f, admission=admission.admission_facts(
                r, self.caches.nodes.by_index("pool", r.pool), seen.values(), self.spec, self.clock()))
        if need.spares:
            taken = {x.replacement for x in seen.values() if x.replacement and x.active and x.name != r.name}
            f = replace(f, claimed=frozenset(taken) | self.claims.lending_nodes())
        if need.checkpoints:
            f = replace(f, checkpoints=signals.checkpoints_under_way(seen.values(), r.name, self.clock()))
        return f

    # --- a lending pass ------------------------------------------------------------------------------

    def slurm_everything(self) -> tuple[dict[str, SlurmNodeView], list]:
        """Every Slurm node and the pending jobs; nothing when Slurm does not answer (then no idle node is
        lent or taken back: nothing is known of them; spares still follow the floor, which needs only
        Kubernetes)."""
        if self.slurm is None:
            return {}, []
        try:
            return self.slurm_nodes(), call(self.slurm.pending_jobs)
        except TemporaryError as e:
            log.warning("lending: Slurm unreachable (%s): idle nodes wait, spares go on", e)
            return {}, []

    def slurm_nodes(self) -> dict[str, SlurmNodeView]:
        """Every Slurm node, as the core sees it (who set its reason named); raises TemporaryError when Slurm does
        not answer. Only with a Slurm client."""
        assert self.slurm is not None
        return {n.name: slurm_view(n, self.users) for n in call(self.slurm.nodes)}

    def pool(self, pool: NodePool, slurm: dict[str, SlurmNodeView], pending: Iterable) -> lending.PoolFacts:
        """One pool's nodes, the Slurm nodes and pods on each, and the jobs waiting for it."""
        c = self.caches
        nodes = tuple(sorted(c.nodes.by_index("pool", pool.name), key=lambda n: n.name))
        partitions = {p.name for p in self.spec.slurm.partitions if pool.name in p.pools}
        slurm_on, pods = [], []
        for n in nodes:
            here = c.pods_on(n.name)
            slurm_on.append((n.name, tuple(slurm[x] for x in slurm_nodes_on(n.name, here).names if x in slurm)))
            if leaving := tuple(evictable_views(here)):
                pods.append((n.name, leaving))
        waiting = tuple(PendingJob(j.job_id, tuple(j.partitions), j.node_count, j.reason, j.hold)
                        for j in pending if set(j.partitions) & partitions)
        return lending.PoolFacts(pool.name, nodes, tuple(slurm_on), tuple(pods), waiting)

    def pool_shared(self, f: lending.PoolFacts) -> lending.PoolFacts:
        """The pool's remediations, with the steps being applied. Call it under `claims.lock`."""
        seen = {x.name: x for x in self.caches.remediations_in({f.pool})}
        seen.update({x.name: x for x in self.claims.applying() if x.pool == f.pool})
        live = [x for x in seen.values() if x.active]
        return replace(f, remediated=frozenset(x.node for x in live),
                       claimed=frozenset(x.replacement for x in live if x.replacement),
                       waiting_for_spare=sum(1 for x in live if x.phase is Phase.WAITING_FOR_SPARE))

    # --- Slurm and the providers ---------------------------------------------------------------------

    def slurm_views(self, names: Iterable[str]) -> tuple[SlurmNodeView, ...]:
        """Slurm's view of these nodes (the repair loop reads where they run); unknown ones are not seen."""
        return self._slurm_views(names)

    def _slurm_views(self, names: Iterable[str]) -> tuple[SlurmNodeView, ...]:
        out = []
        for name in sorted(set(names)):
            if self.slurm is None:
                out.append(SlurmNodeView(name))
                continue
            try:
                out.append(slurm_view(self.slurm.node(name), self.users))
            except SlurmError as e:
                if e.temporary:
                    raise TemporaryError(f"Slurm: {e}") from None
                # unknown to Slurm (a dynamic node not registered yet, or gone): not seen
        return tuple(out)

    def jobs_on(self, names: Iterable[str]) -> tuple[JobView, ...]:
        """The jobs Slurm says run on these nodes (a diagnosis waits for them to end)."""
        return self._jobs(names)

    def _jobs(self, names: Iterable[str]) -> tuple[JobView, ...]:
        if self.slurm is None:
            return ()
        jobs: dict[int, JobView] = {}
        for name in names:
            for j in call(self.slurm.jobs_on_node, name):
                jobs[j.job_id] = JobView(j.job_id, j.state, tuple(j.nodes))
        return tuple(jobs.values())

    def _failed(self, names: Iterable[str], since: datetime) -> tuple[JobView, ...]:
        """The jobs Slurm failed off these nodes since then, as accounting recorded them; none where no accounting
        runs or it does not answer now (those jobs then miss their note, never the heal its step)."""
        if self.slurm is None:
            return ()
        try:
            failed = self.slurm.jobs_failed_on(sorted(set(names)), since.timestamp())
        except SlurmError as e:
            log.warning("jobs Slurm requeued off %s not read from accounting (their admin comments will not tell "
                        "it): %s", ",".join(sorted(set(names))), e)
            return ()
        return tuple(JobView(j.job_id, j.state, tuple(j.nodes)) for j in failed)

    def refusal(self, pool: str) -> str:
        """The provider's no to one more node of the pool, in its words ('' when it has room)."""
        provider = self.providers[pool]
        says = getattr(provider, "refill_refusal", None)
        if says is not None:
            return says(pool)
        check = getattr(provider, "can_refill", None)
        return "" if check is None or check(pool) else "no room for another node"
