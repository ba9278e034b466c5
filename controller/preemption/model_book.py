"""Which preemption model applies to a VM: the one configured, the shipped defaults,
or one learned from the lifetimes this controller observed.

Two questions, two answers:
- `configured(...)`: how VMs of a type really die in the local and sim drivers
  (they sample lifetimes from it), and what the scheduler assumes at first;
- `belief(...)`: what the scheduler assumes now: a model learned online for the
  VM's (driver, type, zone, time of day, day) when one has enough samples, else
  the configured one.

Reuse tables (policies.reuse.ReuseTable) are built once per model and cached.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from drivers.base import VmType
from policies.preemption import Bathtub, Exponential, LifetimeModel, NoPreemption
from policies.registry import ModelEntry, ModelKey, ModelRegistry
from policies.reuse import ReuseTable

if TYPE_CHECKING:  # the configuration (pydantic) is a type here: checkpoint-plan needs none
    from controller.config import PreemptionConfig

SHIPPED_REGISTRY = "preemption_models.json"


def load_registry(path: str = "", min_samples: int = 30) -> ModelRegistry:
    """The model registry in `path`, or the one shipped with spotbag (fitted to real
    Google preemptible VM lifetimes; see controller/data/)."""
    if path:
        text = Path(path).read_text()
    else:
        text = resources.files("controller").joinpath("data", SHIPPED_REGISTRY).read_text()
    registry = ModelRegistry.from_dict(json.loads(text))
    return ModelRegistry(registry.entries, min_samples)


@dataclass(frozen=True)
class Belief:
    model: LifetimeModel
    key: str  # the registry key it was found under, or "config"
    source: str  # "config", "default" (shipped) or "learned"


class ModelBook:
    def __init__(
        self,
        settings: PreemptionConfig,
        driver_name: str,
        model_keys: dict[str, str],
        launch_h: float,
        defaults: ModelRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.driver_name = driver_name
        self.model_keys = model_keys  # VM type name -> configured model key ("" for the default)
        self.launch_h = launch_h
        self.defaults = (
            defaults
            if defaults is not None
            else (
                load_registry(settings.registry_file, settings.min_samples)
                if settings.model == "fitted"
                else ModelRegistry({}, settings.min_samples)
            )
        )
        self.learned = ModelRegistry({}, settings.min_samples)
        self._tables: dict[LifetimeModel, ReuseTable] = {}
        self._fixed = self._fixed_model()

    def _fixed_model(self) -> LifetimeModel | None:
        s = self.settings
        if s.model == "none":
            return NoPreemption()
        if s.model == "exponential":
            return Exponential(mttf_h=s.mttf_h, L=s.max_lifetime_h)
        if s.model == "bathtub":
            return Bathtub(
                A=s.bathtub_A,
                tau1=s.bathtub_tau1,
                tau2=s.bathtub_tau2,
                b=s.bathtub_b,
                L=s.deadline_h,
            )
        return None  # fitted: per VM type, from the registry

    def key_of(self, vm_type: VmType) -> ModelKey:
        """The registry key a VM type's configured model is looked up under."""
        configured = self.model_keys.get(vm_type.name, "")
        if configured:
            return ModelKey.parse(configured)
        return ModelKey(self.driver_name, vm_type.name, vm_type.zone or "*")

    def configured(self, vm_type: VmType, when: dt.datetime | None = None) -> Belief:
        if self._fixed is not None:
            return Belief(self._fixed, "config", "config")
        key = self.key_of(vm_type)
        entry = self.defaults.lookup(key.provider, key.vm_type, key.zone, when)
        if entry is None:
            return Belief(NoPreemption(), "none", "config")
        return Belief(entry.model, entry.key.text(), entry.source)

    def belief(self, vm_type: VmType, zone: str, when: dt.datetime | None = None) -> Belief:
        """A learned model when one applies; one learned over all VM types does not
        override a configured model that is specific to this type (fitted mode)."""
        entry = self.learned.lookup(self.driver_name, vm_type.name, zone or "*", when)
        if entry is not None and (entry.key.vm_type != "*" or self._fixed is not None):
            return Belief(entry.model, entry.key.text(), "learned")
        return self.configured(vm_type, when)

    def learn(self, entries: list[ModelEntry]) -> None:
        self.learned = self.learned.with_entries(entries)

    def table(self, model: LifetimeModel) -> ReuseTable | None:
        """The reuse decisions for a model; None when the policy is to always reuse."""
        memoryless = isinstance(model, Exponential) and model.L is None  # reuse always pays
        if self.settings.reuse_policy == "always" or isinstance(model, NoPreemption) or memoryless:
            return None
        table = self._tables.get(model)
        if table is None:
            table = ReuseTable.build(model, self.launch_h, spare_horizon_h=1.0)
            self._tables[model] = table
        return table
