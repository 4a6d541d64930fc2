"""Training tables: ids + loss mask from stored generations, snapshots and exports."""

from .samples import build_training_samples

__all__ = ["build_training_samples"]
