"""The ranks of a multi-process run, kept in lockstep, and the watchdog on their collectives.

Under DeepSpeed ZeRO-3 and FSDP every forward pass gathers the layers' weights with collectives,
so every rank must run the same forwards in the same order (DESIGN.md section 10). Where ranks
hold different amounts of work (conversations with more turns, replies of other lengths, a share
of the dev instances), they agree before each round with one small all-reduce:

    ranks = Ranks.current()
    while ranks.any(bool(active)):        # some rank still has conversations
        for _ in range(ranks.most(len(chunks))):
            ...                           # a rank out of chunks calls with zero rows

`Ranks.current()` outside a process group (one process, `fic eval`) is one rank alone: `any` and
`most` return their argument and `gather` a one-item list, with no collective and no torch
import, so the one-process code path is the same code.

The watchdog: the process group is started with a bound on how long one collective may wait
(`train.collective_timeout_s`, `fic.training.loop.make_accelerator`), and the recipe names what
each rank is doing (`with phase("dev curve at step 3"): ...`). A collective that waits past the
bound, or whose peer died, becomes a `FicError` naming this rank and the phase, never a silent
hang on a paid cluster. This module imports torch only inside the collectives.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator

from fic.core.errors import FicError, one_line

TIMEOUT_SETTING = "train.collective_timeout_s"
# What torch.distributed's backends say when a collective waited past its bound (gloo: "Timed out
# waiting 5000ms for recv operation", NCCL: "Watchdog caught collective operation timeout") and when
# the rank at the other end is gone (a rank that failed: gloo "Connection closed by peer").
TIMED_OUT = ("timed out", "timeout")
PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "connection refused")

_watch: dict[str, Any] = {"phase": "start-up", "timeout_s": None}


class Ranks:
    """This process's rank among `world` and the collectives that keep the ranks in lockstep."""

    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = rank, world

    @classmethod
    def current(cls) -> Ranks:
        """The ranks of torch.distributed's default process group, or one rank alone without one."""
        if "torch" not in sys.modules:  # no torch loaded: there is no process group either
            return cls()
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return cls()
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def lockstep(self) -> bool:
        return self.world > 1

    def share_of(self, items: list) -> list:
        """This rank's share of `items`: every world-th one from its rank (rank r of w takes r, r+w, ...)."""
        return list(items[self.rank::self.world])

    def any(self, flag: bool) -> bool:
        """Whether `flag` holds on some rank (the same answer on every rank)."""
        return bool(self._max(int(bool(flag))))

    def most(self, count: int) -> int:
        """The largest `count` over the ranks."""
        return int(self._max(int(count)))

    def total(self, value: float) -> float:
        """The sum of `value` over the ranks (the same on every rank; float64)."""
        return float(self._reduce(float(value), "sum"))

    def gather(self, obj: Any) -> list | None:
        """Every rank's `obj` on the main process (in rank order), None on the others."""
        if not self.lockstep:
            return [obj]
        import torch.distributed as dist

        found: list | None = [None] * self.world if self.main else None
        with _translated():
            dist.gather_object(obj, found, dst=0)
        return found

    def share(self, obj: Any) -> Any:
        """The main process's `obj`, on every rank."""
        if not self.lockstep:
            return obj
        import torch.distributed as dist

        box = [obj if self.main else None]
        with _translated():
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def from_main(self, work: Callable[[], Any]) -> Any:
        """`work()` run on the main process (what writes files), its result on every rank. Where it
        fails, every rank fails with it (the main process with its own error, the others with one
        line saying so) instead of the others waiting for the main process in the next collective."""
        if not self.lockstep:
            return work()
        result = None
        if self.main:
            try:
                result = work()
            except Exception as err:
                self.share((None, one_line(str(err)) or type(err).__name__))
                raise
        result, failure = self.share((result, None))
        if failure is not None:
            raise FicError(f"the main process stopped: {failure}")
        return result

    def barrier(self) -> None:
        if self.lockstep:
            import torch.distributed as dist

            with _translated():
                dist.barrier()

    def _max(self, value: int) -> int:
        return int(self._reduce(value, "max"))

    def _reduce(self, value: float, op: str) -> float:
        if not self.lockstep:
            return value
        import torch
        import torch.distributed as dist

        device = "cpu"
        if "nccl" in str(dist.get_backend()):  # NCCL reduces only tensors on this rank's GPU
            device = f"cuda:{torch.cuda.current_device()}"
        box = torch.tensor([value], dtype=torch.float64 if isinstance(value, float) else torch.long, device=device)
        with _translated():
            dist.all_reduce(box, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return box.item()


def watch(timeout_s: float) -> None:
    """Record the bound the process group was started with (for the watchdog's message)."""
    _watch["timeout_s"] = timeout_s


def current_phase() -> str:
    return _watch["phase"]


@contextlib.contextmanager
def phase(label: str) -> Iterator[None]:
    """Name what this rank is doing for the watchdog: a collective inside that waits past the
    bound, or loses its peer, becomes one line naming this rank and `label`."""
    before = _watch["phase"]
    _watch["phase"] = label
    try:
        with _translated():
            yield
    finally:
        _watch["phase"] = before


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except FicError:
        raise
    except RuntimeError as err:  # torch.distributed's DistBackendError and DistError are RuntimeErrors
        failure = collective_failure(err)
        if failure is None:
            raise
        raise failure from None


def collective_failure(err: BaseException) -> FicError | None:
    """The watchdog's line for a collective that waited past its bound or lost its peer; None for
    any other error."""
    text = str(err).lower()
    timed_out, gone = any(t in text for t in TIMED_OUT), any(t in text for t in PEER_GONE)
    if not (timed_out or gone):
        return None
    rank, world = _rank_world()
    bound = _watch["timeout_s"]
    where = f"rank {rank} of {world} in phase '{_watch['phase']}'"
    if timed_out:
        limit = f"{bound:g} s ({TIMEOUT_SETTING})" if bound is not None else "the process group's timeout"
        return FicError(f"{where}: a collective waited past {limit} for the other ranks: some rank is elsewhere (a "
                        "forward or a collective it skipped, or a rank stuck or dead; the other ranks' lines say "
                        "where they were)", field=TIMEOUT_SETTING)
    return FicError(f"{where}: another rank is gone in the middle of a collective (it failed or was killed: its own "
                    "line says why)")


def _rank_world() -> tuple[int, int]:
    """This rank and the world, from the environment the launcher set (the group may be what broke)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
