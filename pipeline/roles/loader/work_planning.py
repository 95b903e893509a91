"""A source's work plan as one loader knows it. Loader instance 0 publishes the plan, and with
``next_epoch`` the epochs the constructor asks for; every instance reads it, takes in the finer units its
committed transactions split off (``unit_sizing.py``), and tells when every unit of it is done."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from connectors import WorkUnit
from pipeline.kafka.control import UnitCost, read_unit_cost
from pipeline.kafka.work_plan import (
    WorkPlan,
    extend_work_plan,
    plan_is_complete,
    publish_work_plan,
    read_work_plan,
    requested_epoch,
)
from pipeline.roles.loader.options import LoaderOptions
from pipeline.roles.loader.source_runtime import COST_SAMPLE_BYTES, SourceRuntime
from pipeline.roles.loader.topic_partitions import partition_count
from pipeline.roles.loader.unit_sizing import UnitSizer
from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig
from topics.kafka.offset_lookup import OffsetLookup
from topics.kafka.retry import KafkaUnavailableError

log = logging.getLogger(__name__)


class SourcePlanning:
    """The plan of ``runtime``'s source; ``name`` (the loader's transactional id) names the loader in logs
    and in the costs it measures."""

    def __init__(
        self,
        config: KafkaConfig,
        topics: JobTopics,
        runtime: SourceRuntime,
        seed: int,
        options: LoaderOptions,
        name: str,
    ) -> None:
        self.config = config
        self.topics = topics
        self.runtime = runtime
        self.source = runtime.spec.name
        self.seed = seed
        self.options = options
        self.name = name
        self.plan = WorkPlan(self.source, 0, {})  # the source's plan as last read or extended
        self.sizer: UnitSizer | None = None  # with the source's unit_target_s: splits units by measured cost

    def ensure_plan(self, stopping: Callable[[], bool]) -> WorkPlan | None:
        """The source's work plan. Instance 0 publishes it when there is none yet; the other instances
        wait for it, so two planners never race. None when ``stopping()`` while waiting."""
        deadline = time.monotonic() + self.options.plan_wait_s
        backoff = 0.05
        while (plan := read_work_plan(self.config, self.topics, self.source)) is None:
            if self.options.instance == 0:
                plan = self._publish_plan()
                break
            if stopping():
                return None
            if time.monotonic() > deadline:
                msg = (
                    f"loader {self.name}: no work plan for {self.source} on {self.topics.plan(self.source)} "
                    f"after {self.options.plan_wait_s:.0f} s; loader instance 0 of the source publishes it"
                )
                raise MixflowError(msg)
            log.info("loader %s: waiting for instance 0 to publish the work plan", self.name)
            time.sleep(backoff)  # polling a topic that has no record to wait on yet
            backoff = min(2 * backoff, 1.0)
        self.plan = plan
        return plan

    def _publish_plan(self) -> WorkPlan:
        target = self.runtime.spec.unit_target_s
        if target is None:
            units = self.runtime.plan(self.seed, self.options.unit_seconds)
            return publish_work_plan(self.config, self.topics, self.source, units, self.work_partitions())
        # The planner's measurement is the source's first recorded cost, so loaders can split from the start.
        per_byte = self.runtime.measure_cost()
        cost = UnitCost(self.source, COST_SAMPLE_BYTES, per_byte * COST_SAMPLE_BYTES, 0, "planner")
        units = self.runtime.plan(self.seed, target, cost_per_byte=per_byte)
        return publish_work_plan(self.config, self.topics, self.source, units, self.work_partitions(), cost)

    def start_sizing(self) -> None:
        """With the source's ``unit_target_s``, size units by the source's recorded cost from now on."""
        if (target := self.runtime.spec.unit_target_s) is not None:
            cost = read_unit_cost(self.config, self.topics, self.source)
            self.sizer = UnitSizer(self.runtime.reader, target, cost, self.name)

    def committed(self) -> None:
        """A transaction committed: take in its measured cost and the finer units it split off."""
        if self.sizer is not None:
            self.plan = self.sizer.committed(self.plan)

    def drained(self, offsets: OffsetLookup) -> bool:
        """Every unit of the source is done, finer units split off by any loader included."""
        done, self.plan = plan_is_complete(self.config, self.topics, offsets, self.plan)
        return done

    def plan_requested_epochs(self) -> None:
        """Plan and publish the epochs the constructor asked for that are not planned yet; while the brokers
        are away, the next call looks again."""
        try:
            wanted = requested_epoch(self.config, self.topics, self.source)
            if wanted is None or wanted < self.plan.epochs_planned(self.runtime.spec.epochs):
                return
            log.info("loader %s: planning %s up to epoch %d, as asked", self.name, self.source, wanted)
            self.plan = extend_work_plan(
                self.config,
                self.topics,
                self.source,
                self.runtime.spec.epochs,
                wanted,
                self._plan_epoch,
                self.work_partitions(),
            )
        except KafkaUnavailableError as exc:
            log.warning("loader %s: cannot read the epochs asked for: %s", self.name, exc)

    def _plan_epoch(self, epoch: int) -> list[WorkUnit]:
        """The units of ``epoch``; with a unit target, sized by the source's recorded cost, not measured again."""
        if self.sizer is None:
            return self.runtime.plan(self.seed, self.options.unit_seconds, epochs=[epoch])
        per_byte = self.sizer.cost.seconds_per_byte if self.sizer.cost else None
        return self.runtime.plan(self.seed, self.sizer.target_s, epochs=[epoch], cost_per_byte=per_byte)

    def work_partitions(self) -> int:
        return partition_count(self.config, self.topics.work(self.source))
