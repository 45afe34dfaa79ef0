"""``cluster.elastic``: training that survives losing and gaining workers, without restarts.

In a task of an elastic launch (not a doctest: it needs the cluster)::

    strategy = cluster.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = cluster.Variable(np.zeros(D))
        optimizer = cluster.optimizers.SGD(0.05, momentum=0.9)
    state = cluster.elastic.State(w=w, optimizer=optimizer, step=0)

    @cluster.elastic.run(strategy, state)
    def train(state):
        while state.step < STEPS:
            strategy.run(replica_step, args=global_batch(state.step))
            state.step += 1
            state.commit()

    train(state)

- :class:`State`: trackables (changed in place) and plain values; ``commit()``, ``restore()``,
  ``sync(strategy)``, ``register_reset_callbacks(fns)``.
- :func:`run`: on a lost peer or a task waiting to join, roll back to the last commit, re-form
  the group, hand the committed state to every member, call the function again.
- :class:`MembershipChanged`, :class:`RegroupLimitError`, and
  :class:`~cluster.errors.ElasticGroupError` (the group cannot re-form: below the minimum).

With a global batch that does not depend on the number of replicas, split among them, and the
loss scaled by the global batch, the result equals the run without the change of membership.
Launch with ``clusterctl launch -n 4 --elastic 2:4 train.py``; without ``--elastic`` the same
program runs as any other (``run`` calls the function once).
"""

from __future__ import annotations

from cluster.elastic._errors import ElasticGroupError, MembershipChanged, RegroupLimitError
from cluster.elastic._run import MAX_REGROUPS_WITHOUT_COMMIT, run
from cluster.elastic._state import State

__all__ = [
    "MAX_REGROUPS_WITHOUT_COMMIT",
    "ElasticGroupError",
    "MembershipChanged",
    "RegroupLimitError",
    "State",
    "run",
]
