"""The names Serve gives what this app deploys, and how to read a replica's id out of them: one place.

Ray names each Serve replica actor ``SERVE_REPLICA::<app>#<deployment>#<id>``
(the ``<id>`` is Serve's ``ReplicaId``, the label of every metric the
replica exports) and its class ``ServeReplica:<app>:<deployment>`` (its
process title ``ray::ServeReplica:<app>:<deployment>``). The builder keeps
``ray.serve.llm``'s engine deployment name, ``LLMServer:<model id>``, which
dashboards, the load-test monitor and :class:`load_tests.operate.local_cluster.LocalCluster`
know. Importing this module imports nothing of Ray.
"""

from __future__ import annotations

# The application's name in serve_config.yaml.
APP = "fuzzserve"
# An engine deployment's name is this + the model id (ray.serve.llm's own name, kept by the builder).
ENGINE_DEPLOYMENT_PREFIX = "LLMServer:"
# Every Serve replica actor's class name starts with this; its process title with "ray::" + this.
REPLICA_CLASS_PREFIX = "ServeReplica:"
PROCESS_TITLE_PREFIX = f"ray::{REPLICA_CLASS_PREFIX}"


def replica_class_prefix(app: str = APP, deployment_prefix: str = "") -> str:
    """The class-name prefix of ``app``'s replica actors (of its deployments named ``deployment_prefix``...)."""
    return f"{REPLICA_CLASS_PREFIX}{app}:{deployment_prefix}"


# The class-name prefix of the shipped app's engine replicas.
ENGINE_REPLICA_CLASS = replica_class_prefix(APP, ENGINE_DEPLOYMENT_PREFIX)


def replica_id(actor_name: str) -> str:
    """Serve's ``ReplicaId`` (the metrics' label) from a replica actor's name ``SERVE_REPLICA::app#deployment#<id>``."""
    return actor_name.rsplit("#", 1)[-1]


# Ray's prefix of a replica actor's name, which is also Serve's full replica id (ReplicaID.to_full_id_str).
REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"


def replica_full_id(replica: str, deployment: str, app: str = APP) -> str:
    """Serve's full replica id (what a request router sees: ``ReplicaID.to_full_id_str()``, also the replica
    actor's name) of ReplicaId ``replica`` of ``app``'s ``deployment``."""
    return f"{REPLICA_ACTOR_PREFIX}{app}#{deployment}#{replica}"
