"""What an agent's handler and the runtime say to each other, apart from the checkpoint.

- `Rejected`: a handler raises it for a valid record the pipeline refuses by rule; the runtime
  dead-letters the record with the rule's name and goes on.
- `PipelineHook`: a subscriber to what the pipeline did. The analytics agent is one
  (`streams/agents/analytics.py` adds itself with `Runtime.add_hook`); the runtime calls every
  hook, in the order added, and works the same with none. Agents report through
  `Runtime.feed_analytics` / `Runtime.erase_analytics`; the runtime reports its dead letters.
  Every call carries the checkpoint of the batch attempt being handled
  (streams/runtime/checkpoint.py): a hook stages its table updates through it, so they are
  written with that attempt, or dropped with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol

from streams.contracts.deadletter import STAGE_VALIDATE

if TYPE_CHECKING:
    from streams.runtime.checkpoint import Checkpoint


class Rejected(Exception):
    """A valid record the pipeline refuses by rule; dead-lettered with the rule's name."""

    def __init__(self, reason: str, rule: str = "rejected", stage: str = STAGE_VALIDATE) -> None:
        super().__init__(reason)
        self.reason = reason
        self.rule = rule
        self.stage = stage


class PipelineHook(Protocol):
    def increments(self, cp: "Checkpoint", increments: Iterable[Any]) -> None:
        """Classified increments of the record being handled (staged through `cp`)."""

    def erase(self, cp: "Checkpoint", subject: str) -> None:
        """Stage the removal of everything kept about `subject` (the last step of an erasure)."""

    def dead_lettered(self, cp: "Checkpoint", record: Mapping[str, Any], event_time_ms: int, index: int,
                      partition: int) -> None:
        """A dead letter was sent: `record` (the DeadLetter record), the input's timestamp, the
        n-th dead letter of that input (`index`) and its partition."""
