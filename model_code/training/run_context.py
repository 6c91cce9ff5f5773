"""What one torchvision training run knows, in a module of its own.

The trainer builds it and the exporter reads it; keeping it here lets ``export`` type its
argument without importing the trainer that imports ``export`` (no import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass

from model_code.dataset_version import Categories, DatasetVersion
from model_code.training.config import Hyperparameters, TrainingEnvironment
from model_code.training.distributed import Schedule, WorldPlan


@dataclass(frozen=True)
class RunContext:
    env: TrainingEnvironment
    hp: Hyperparameters
    plan: WorldPlan
    schedule: Schedule
    dataset: DatasetVersion
    val_dataset: DatasetVersion
    categories: Categories
    model_name: str
    threads: int

    @property
    def has_masks(self) -> bool:
        return self.dataset.task == "instance_segmentation"
