"""The runtime: informers, the work queue, its workers, the Lease, metrics."""
