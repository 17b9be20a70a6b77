"""Leave no placement group behind when Tune ends a trial.

When ASHA stops a trial (or its time budget ends), Tune kills the trial's driver actor while its Ray Train
controller is still live; the controller dies with it and the workers' placement group stays CREATED,
holding the CPUs/GPUs the next trial needs (Ray issues #54305, #47440). Train V2's own PlacementGroupCleaner
polls the State API, which needs the dashboard we keep off. So rank 0 of each trial registers its placement
group with a registry actor owned by the sweep driver, and a Tune callback removes the trial's groups as soon
as Tune calls the trial done, stopped or errored. Trials, like every launch, run without Ray's cleaner
(orchestrator.raytrain.trainer.LeanTrainer): killed with its controller, each one would poll the absent State
API forever, a 200 MB process per stopped trial.
"""

from __future__ import annotations

import logging

import ray
from ray import tune
from ray.util.placement_group import PlacementGroup, get_current_placement_group, remove_placement_group

log = logging.getLogger(__name__)


class PlacementGroupRegistry:
    """Placement groups by trial; made an actor, named and owned by the sweep driver, where the sweep starts."""

    def __init__(self) -> None:
        self.groups: dict[str, set[str]] = {}

    def register(self, trial_id: str, group_hex: str) -> None:
        self.groups.setdefault(trial_id, set()).add(group_hex)

    def pop(self, trial_id: str | None = None) -> list[str]:
        if trial_id is None:
            out = sorted({g for groups in self.groups.values() for g in groups})
            self.groups.clear()
            return out
        return sorted(self.groups.pop(trial_id, set()))


def register_current_group(registry_name: str, trial_id: str) -> None:
    """Called by rank 0 inside a trial (its WorkerArgs.on_start): record the group's placement group."""
    group = get_current_placement_group()
    if group is not None:
        ray.get(ray.get_actor(registry_name).register.remote(trial_id, group.id.hex()))


def remove_groups(group_hexes: list[str]) -> int:
    table = ray.util.placement_group_table()
    removed = 0
    for group_hex in group_hexes:
        if table.get(group_hex, {}).get("state") in (None, "REMOVED"):
            continue
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_hex))))
        removed += 1
    return removed


class ReapPlacementGroups(tune.Callback):
    def __init__(self, registry_name: str) -> None:
        self.registry_name = registry_name  # a name, not a handle: Tune pickles callbacks with its state

    def _reap(self, trial_id: str | None) -> None:
        registry = ray.get_actor(self.registry_name)
        removed = remove_groups(ray.get(registry.pop.remote(trial_id)))
        if removed:
            log.info("removed %d placement group(s) left by trial %s", removed, trial_id or "(any)")

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._reap(trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._reap(trial.trial_id)

    def on_experiment_end(self, trials, **info) -> None:
        self._reap(None)

