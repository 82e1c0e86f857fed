"""The node daemon (``gpreempt serve``): one per machine or user, it owns the runtime directory.

Open :mod:`.server` first: the loop. Each turn it serves what is readable
(:mod:`.connections`: peers, bounded reply queues; :mod:`.handlers`: one method per request
op), then runs a scheduling pass (:mod:`.reconcile`): take a snapshot, ask the policy
(:mod:`gpreempt.policy`), turn its decision into a frozen plan (:mod:`.plan`, a pure function)
and carry it out (:mod:`.apply`: suspend, resume, control-block words, watch lists). A task's
state changes in one place (:mod:`.task_state`). Beside the loop: the driver lock behind the
gate (:mod:`.backstop`), memory eviction (:mod:`.memory`), persistence and re-attach
(:mod:`.persist`, :mod:`.lifecycle`), per-user bounds (:mod:`.limits`), the event log
(:mod:`.event_log`) and Prometheus metrics (:mod:`.prometheus`).
"""
