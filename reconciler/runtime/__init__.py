"""The reconciler's runtime: everything around the pure core that reads, waits and acts. One job each:

    manager.py          the process: caches, the node queue and its workers, the timed passes, the resync,
                        the Lease and the metrics server, wired once
    triggers.py         which node names a change seen by an informer queues (a new fault first)
    workqueue.py        the node queue: de-duplicated, one worker per node, delays, per-node backoff
    caches.py           the informers' caches of nodes, pods and remediations, with the reconciler's own
                        writes in them (a step sees what the last one did)
    informers.py        list + watch one kind into a cache of small views
    healing.py          the healing reconcile of one node: detect, the steps that carry, one write
    diagnoses.py        a node's diagnosis (a `diagnose` fault): checked while it stays in service
    facts.py            observation: what a step needs (the core's `needs`), from the caches and Slurm
    claims.py           what is taken and not written yet (admission slots, spares, nodes a lending
                        pass is changing), counted under one lock
    executor.py         the only code that acts; every action fenced by the Lease, nothing in a dry run
    alerts.py           metrics, gauges and log lines for gates and phase moves
    token_alarm.py      the Slurm token a Slinky Token stopped refreshing: gauges, one page per episode
    timers.py           timed runnables: a periodic pass with a loop of its own
    membership_pass.py  pool membership and spares at their count, a timed runnable
    lending_pass.py     lending and its ledger, a timed runnable
    active_check_pass.py  active checks of idle nodes and spares (Slurm reservations, the check Jobs), a timed runnable
    retention_pass.py   deleting finished remediations, a timed runnable
    telemetry_pass.py   GPU telemetry (dcgm-exporter) judged: degraded nodes, stragglers, hangs; a timed runnable
    holds_pass.py       people's Slurm drains Slinky's operator overwrote, put back; a timed runnable
    slurm_drains_pass.py  nodes Slurm drained itself: the condition each reason asks for; a timed runnable
    leader.py           leader election on a Lease, with fencing
    metrics.py          Prometheus metrics, /healthz
"""
