"""Who this trainer process is: the attempt it runs (`Identity`) and its place in the
torch.distributed world (`DistEnv`, read from torchrun's environment; one process alone
without it). Every rank reports under the same identity, tagged with its rank; rank 0
alone is the job's reporter (docs/decisions/0017-multi-rank.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Identity:
    job_id: str
    attempt_id: str
    attempt_number: int


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_reporter(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> DistEnv:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        return cls(rank, world, local, device)
