"""What is Ray's own on Ray's workers: the node's id, the model actor that signs in to the run's
roster, and the roster. The work itself is engine-neutral (score/batches.py: read_shard,
BatchScorer, measure); Ray pickles these by this module's path, so every worker imports them
from the package.
"""
from __future__ import annotations

from ..batches import BatchScorer


def node_id() -> str:
    """The Ray node this task or actor runs on (`ray list nodes` names it); "" outside Ray."""
    import ray
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


class ScoreActor(BatchScorer):
    """A BatchScorer in a Ray actor: it signs in to the run's roster (the driver ends it when the
    run ends) and names its node in each row it scores."""

    def __init__(self, *args, roster=None, **kwargs):
        if roster is not None:  # the driver ends this actor itself when the run ends (ActorRoster)
            import ray
            roster.add.remote(ray.get_runtime_context().current_actor)
        super().__init__(*args, node=node_id(), **kwargs)


class ActorRoster:
    """A Ray actor (no CPU) that the run's ScoreActors sign in to, restarted ones included. Ray
    Data drops its actor pool by reference only, and the references can outlive the run (a
    dataset in a reference cycle, the lineage of the blocks an actor made): the actors, and their
    CPUs and GPUs, would stay until a garbage collection, and a --resume in the same cluster could
    wait for them for ever. The driver kills every actor on the roster when the stream ends."""

    def __init__(self):
        self.actors = {}

    def add(self, actor) -> None:
        self.actors[actor._actor_id.hex()] = actor

    def all(self) -> list:
        return list(self.actors.values())
