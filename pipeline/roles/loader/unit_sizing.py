"""Work units that adapt to a source's measured cost: a loader splits a unit it takes when loading it
would run over the source's ``unit_target_s``.

The loader times every unit it loads and writes the cost (``unit-cost`` records, ``pipeline/kafka/control.py``)
in the unit's transaction. A unit whose estimated time (its bytes times the source's cost per byte)
exceeds ``SPLIT_SLACK`` times the target is not read: its finer units (``connectors.planning.split_unit``:
row groups, then row ranges) go to the work topic with a plan record covering them, in the transaction
that commits the unit's offset (``pipeline.kafka.work_plan.produce_units``). Sample ids name the file and row,
never the unit, so they are the same however a file is cut.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Producer

from connectors import Reader, WorkUnit
from connectors.planning import split_unit, unit_bytes
from pipeline.kafka.control import UnitCost, unit_cost_key
from pipeline.kafka.work_plan import WorkPlan, produce_units
from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.kafka.clients import produce

log = logging.getLogger(__name__)

# A unit is split once its estimate passes the target by half: units cut to the target under one
# estimate are not cut again for a slightly higher one.
SPLIT_SLACK = 1.5


class UnitSizer:
    """One loader's view of its source's cost, its split decisions, and the records of one transaction."""

    def __init__(self, reader: Reader, target_s: float, cost: UnitCost | None, measured_by: str) -> None:
        self.reader = reader
        self.target_s = target_s
        self.cost = cost
        self.measured_by = measured_by
        self._children: list[WorkUnit] = []
        self._measured: UnitCost | None = None
        self._plan: WorkPlan | None = None  # the plan with this transaction's finer units

    @property
    def source(self) -> str:
        return self.reader.source

    def estimate_s(self, unit: WorkUnit) -> float | None:
        """Seconds ``unit`` should take to load, by the measured cost; None before any measurement."""
        per_byte = self.cost.seconds_per_byte if self.cost else None
        return None if per_byte is None else unit.estimated_bytes * per_byte

    def split(self, unit: WorkUnit) -> list[WorkUnit] | None:
        """The finer units to publish instead of loading ``unit``, or None to load it."""
        estimate = self.estimate_s(unit)
        if estimate is None or estimate <= SPLIT_SLACK * self.target_s or unit.num_rows < 2:
            return None
        per_byte = estimate / unit.estimated_bytes
        children = split_unit(unit, self.reader.layout(unit.path), unit_bytes(per_byte, self.target_s))
        if len(children) < 2:
            return None
        log.info(
            "splitting %s (about %.2f s at the measured cost, target %.2f s) into %d units",
            unit.unit_id,
            estimate,
            self.target_s,
            len(children),
        )
        return children

    def begin(self) -> None:
        """Forget what an earlier (committed or aborted) transaction held."""
        self._children = []
        self._measured = None
        self._plan = None

    def add_split(self, children: Sequence[WorkUnit]) -> None:
        self._children += children

    def add_measurement(self, unit: WorkUnit, seconds: float) -> None:
        """A unit of this transaction was loaded in ``seconds``."""
        if unit.estimated_bytes <= 0:
            return
        cost = UnitCost(self.source, unit.estimated_bytes, max(seconds, 0.0), 1, self.measured_by)
        self._measured = cost if self._measured is None else self._measured.plus(cost)

    def produce(self, producer: Producer, topics: JobTopics, plan: WorkPlan, partitions: Callable[[], int]) -> None:
        """Produce this transaction's finer units (over ``partitions()`` of the work topic) with their plan
        record, and its cost record, in the producer's open transaction."""
        if self._children:
            try:
                self._plan = produce_units(producer, topics, self.source, self._children, partitions(), plan)
            except MixflowError as exc:  # a delivery failed: abort and redo the transaction
                error = KafkaError(KafkaError._STATE, str(exc), txn_requires_abort=True)
                raise KafkaException(error) from exc
        if self._measured is not None:
            produce(producer, topics.plan(self.source), self._measured.to_json(), key=unit_cost_key(self.source))

    def committed(self, plan: WorkPlan) -> WorkPlan:
        """Take in the committed transaction's measurement; the plan with its finer units."""
        if self._measured is not None:
            self.cost = self._measured if self.cost is None else self.cost.plus(self._measured)
        return plan if self._plan is None else plan.merged(self._plan)
