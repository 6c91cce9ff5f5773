"""detectron2 training data whose order and augmentation are functions of the sample position.

detectron2's ``TrainingSampler`` draws one infinite shuffle from a generator seeded once, and
its transforms draw from the process-global numpy RNG; after a spot restart both start again
from the beginning, so a resumed run trains on other images, flipped otherwise, than the
uninterrupted run would have. Here, over the whole job (every rank together):

- position p maps to image ``perm_e[p mod n]`` with ``e = p // n`` and ``perm_e`` drawn from
  (seed, e): every image once per epoch, a fresh shuffle each epoch (detectron2's semantics),
  and random access, so a run can start anywhere.
- rank r of W takes positions r, r+W, r+2W, ... (detectron2's stride sharding) in batches of
  B: iteration i of the job covers positions [i*W*B, (i+1)*W*B), whatever the world size.
- augmentation randomness (ResizeShortestEdge's size choice, RandomFlip, crops: numpy and
  ``random`` in detectron2's transforms) is seeded per sample from (seed, position).
- images are read by the one image rule (detectron2_mapper.RuleDatasetMapper), not detectron2's reader.
- aspect-ratio grouping (detectron2's default: landscape and portrait images batched apart)
  fills two buckets from the rank's stream; starting at iteration i replays the bucketing of
  the first i batches over integers (no image is read). When every image has the same
  orientation, or grouping is off, batch i is the slice above, reached directly.

Only :func:`build_train_loader` imports detectron2; the rest is unit-tested without it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

POSITION_KEY = "d2ops_position"  # added to each mapped sample; detectron2's models ignore unknown keys
_SAMPLE, _STEP = 0, 1  # separate seed streams: per-sample augmentation, per-iteration model sampling


def sample_seed(seed: int, position: int) -> int:
    """The augmentation seed of the sample at ``position`` (32 bits, what np.random.seed takes)."""
    return int(np.random.SeedSequence(seed, spawn_key=(_SAMPLE, position)).generate_state(1)[0])


def step_seed(seed: int, rank: int, iteration: int) -> int:
    """torch's seed for ``iteration`` on ``rank``: RPN/RoI sampling then replays after a resume too."""
    return int(np.random.SeedSequence(seed, spawn_key=(_STEP, rank, iteration)).generate_state(1)[0])


def orientation(width: int, height: int) -> int:
    """detectron2's aspect-ratio bucket: 0 landscape, 1 otherwise."""
    return 0 if width > height else 1


class ResumableBatchSampler(Sampler[list[tuple[int, int]]]):
    """This rank's batches as ``(image index, global position)`` pairs, from iteration ``start_iter`` on."""

    def __init__(self, size: int, *, images_per_rank: int, rank: int, world_size: int, seed: int,
                 orientations: Sequence[int] | None = None) -> None:
        if size < 1:
            raise ValueError("the train split has no images")
        if images_per_rank < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"images_per_rank={images_per_rank}, rank={rank}, world_size={world_size}: "
                             "need at least one image per rank and 0 <= rank < world_size")
        if orientations is not None and len(orientations) != size:
            raise ValueError(f"{len(orientations)} orientations for {size} images")
        self.size, self.per_rank, self.rank, self.world, self.seed = size, images_per_rank, rank, world_size, seed
        # one orientation for all: grouping changes nothing, and batch i is found without a replay
        self.orientations = orientations if orientations is not None and len(set(orientations)) > 1 else None
        self.start_iter = 0
        self._epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def start_at(self, iteration: int) -> None:
        if iteration < 0:
            raise ValueError(f"start iteration {iteration} < 0")
        self.start_iter = iteration

    def index_at(self, position: int) -> int:
        epoch = position // self.size
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.size)
        return int(self._perm[position % self.size])

    def batch(self, iteration: int) -> list[tuple[int, int]]:
        """Batch ``iteration`` without grouping: this rank's stride of the iteration's positions."""
        first = iteration * self.per_rank * self.world
        return [(self.index_at(p), p) for p in range(first + self.rank, first + self.per_rank * self.world,
                                                         self.world)]

    def _grouped(self) -> Iterator[list[tuple[int, int]]]:
        assert self.orientations is not None
        buckets: tuple[list[tuple[int, int]], ...] = ([], [])
        for k in itertools.count():
            position = k * self.world + self.rank
            index = self.index_at(position)
            bucket = buckets[self.orientations[index]]
            bucket.append((index, position))
            if len(bucket) == self.per_rank:
                yield bucket[:]
                bucket.clear()

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        if self.orientations is not None:
            yield from itertools.islice(self._grouped(), self.start_iter, None)
            return
        for iteration in itertools.count(self.start_iter):
            yield self.batch(iteration)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """numpy's and ``random``'s global RNGs seeded for one sample, then put back as they were."""
    np_state, py_state = np.random.get_state(), random.getstate()
    np.random.seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


class PositionKeyedDataset(Dataset[Any]):
    """``dataset[(index, position)]``: the mapped sample, its augmentation seeded by its position."""

    def __init__(self, dicts: Sequence[Any], mapper: Callable[[Any], Any], seed: int) -> None:
        self.dicts, self.mapper, self.seed = dicts, mapper, seed

    def __len__(self) -> int:
        return len(self.dicts)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, position = key
        with seeded(sample_seed(self.seed, position)):
            sample = self.mapper(self.dicts[index])
        if sample is not None:
            sample[POSITION_KEY] = position
        return sample


def collate(batch: list[Any]) -> list[Any]:
    """No stacking (detectron2 takes a list); a sample the mapper dropped (None) is left out, as upstream."""
    return [sample for sample in batch if sample is not None]


class ResumableLoader:
    """What the trainer iterates: batches from ``start_iter`` on; remembers the last one for the data log."""

    def __init__(self, dataset: PositionKeyedDataset, sampler: ResumableBatchSampler, num_workers: int) -> None:
        self.dataset, self.sampler, self.num_workers = dataset, sampler, num_workers
        self.last_batch: list[tuple[Any, int]] = []  # (image_id, position)
        self._started = False

    def start_at(self, iteration: int) -> None:
        if self._started:
            raise RuntimeError("the data loader is already iterating; set the start iteration before training")
        self.sampler.start_at(iteration)

    def __iter__(self) -> Iterator[list[Any]]:
        self._started = True
        # Its own generator: creating the iterator draws a base seed, which from the global RNG would
        # shift the model's sampling at the first step after every resume.
        loader = DataLoader(self.dataset, batch_sampler=self.sampler, num_workers=self.num_workers,
                            collate_fn=collate, generator=torch.Generator().manual_seed(self.sampler.seed),
                            prefetch_factor=2 if self.num_workers else None)
        for batch in loader:
            if not batch:
                raise RuntimeError("the data mapper dropped every image of a batch")
            self.last_batch = [(sample.get("image_id"), sample[POSITION_KEY]) for sample in batch]
            yield batch


def build_train_loader(cfg: Any, *, rank: int, world_size: int, seed: int) -> ResumableLoader:
    """detectron2's train loader for ``cfg`` (dataset dicts, the rule's DatasetMapper, batch split), resumable."""
    from detectron2.data import DatasetFromList, get_detection_dataset_dicts

    from model_code.training.config import ConfigError
    from model_code.training.detectron2_mapper import RuleDatasetMapper

    dicts = get_detection_dataset_dicts(
        cfg.DATASETS.TRAIN, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS,
        min_keypoints=cfg.MODEL.ROI_KEYPOINT_HEAD.MIN_KEYPOINTS_PER_IMAGE if cfg.MODEL.KEYPOINT_ON else 0,
        proposal_files=cfg.DATASETS.PROPOSAL_FILES_TRAIN if cfg.MODEL.LOAD_PROPOSALS else None)
    if cfg.DATALOADER.SAMPLER_TRAIN != "TrainingSampler":
        raise ConfigError(f"DATALOADER.SAMPLER_TRAIN={cfg.DATALOADER.SAMPLER_TRAIN!r}: only TrainingSampler "
                         "(made resumable here) is supported")
    total = int(cfg.SOLVER.IMS_PER_BATCH)
    if total % world_size:
        raise ConfigError(f"SOLVER.IMS_PER_BATCH={total} is not divisible by the world size {world_size}")
    orientations = ([orientation(d["width"], d["height"]) for d in dicts]
                    if cfg.DATALOADER.ASPECT_RATIO_GROUPING else None)
    sampler = ResumableBatchSampler(len(dicts), images_per_rank=total // world_size, rank=rank,
                                    world_size=world_size, seed=seed, orientations=orientations)
    # serialised like upstream's loader: workers then share one buffer instead of copying Python objects
    dataset = PositionKeyedDataset(DatasetFromList(dicts, copy=False), RuleDatasetMapper(cfg, True), seed)
    return ResumableLoader(dataset, sampler, int(cfg.DATALOADER.NUM_WORKERS))
