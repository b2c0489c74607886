"""ditmem.scheduler.node — the scheduler and simulator for a node of D devices."""
