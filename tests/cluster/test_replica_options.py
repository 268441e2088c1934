"""The decoder replicas' Serve deployment as `vaecast serve --replica-*` flags shape it.

Ray Serve validates a deployment's options when they are set (pydantic models), so
these tests, which need no cluster, check that Serve itself accepts and records what
the flags ask for: a fixed replica count, or autoscaling bounds, and the resources and
request limit per replica. The running deployment is exercised in test_cluster.py.
"""

from __future__ import annotations

import warnings

import pytest

from vaecast.cluster.records import DEPLOYMENT_NAME, ReplicaOptions

with warnings.catch_warnings():
    # Ray Serve's own pydantic models warn on import (Field extra keys, pydantic 2.x).
    warnings.simplefilter("ignore", DeprecationWarning)
    from vaecast.cluster.replica import replica_deployment


def test_a_fixed_count_of_replicas_with_their_resources() -> None:
    options = ReplicaOptions(models=("tiny",), replicas=3, gpus=1.0, cpus=2.0, max_ongoing=4)
    deployment = replica_deployment(options)
    assert deployment.name == DEPLOYMENT_NAME
    assert deployment.num_replicas == 3
    assert deployment.ray_actor_options == {"num_cpus": 2.0, "num_gpus": 1.0}
    assert deployment.max_ongoing_requests == 4
    assert deployment._deployment_config.autoscaling_config is None


def test_max_replicas_turns_on_serve_autoscaling_between_the_bounds() -> None:
    options = ReplicaOptions(models=("tiny",), replicas=1, max_replicas=4, max_ongoing=2)
    config = replica_deployment(options)._deployment_config.autoscaling_config
    assert config is not None
    assert (config.min_replicas, config.max_replicas) == (1, 4)
    assert config.target_ongoing_requests == 1


def test_serve_refuses_bounds_the_cli_would_also_refuse() -> None:
    with pytest.raises(ValueError):
        replica_deployment(ReplicaOptions(models=("tiny",), replicas=3, max_replicas=2))
