"""The end of a job: its last steps, of everything the sources left, and the final state record."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pipeline.planning.mixing import MixerState
from pipeline.spec import OnExhausted

if TYPE_CHECKING:
    from pipeline.roles.constructor.loop import StepLoop

log = logging.getLogger(__name__)


def finish(loop: StepLoop, mixer_state: MixerState, exhausted: set[str]) -> None:
    """End the job. Unless the policy is ``stop``, and once every source has run out, what is left goes out
    in final steps, so every sample of finite sources is delivered exactly once."""
    pool, feed = loop.pool, loop.feed
    all_out = set(exhausted) >= set(pool.sources) or all(feed.is_exhausted(s) for s in pool.sources)
    if loop.spec.on_exhausted is not OnExhausted.STOP and all_out:
        if not loop.read_to_end(pool.sources):
            return
        while not pool.empty():
            if loop.host.at_max_steps(loop.writer.in_flight):
                loop.end_at_max_steps()
                return
            while not loop.pacing.allows(mixer_state.step):
                if not loop.host.running() or not loop.flush():
                    return
            planned = loop.core.final_step(mixer_state, pool.window())
            if not loop.write_planned(planned, exhausted):
                return
            mixer_state = planned.next_state
    last = mixer_state.step - loop.core.lanes
    if loop.write(None, mixer_state, exhausted, finished=True) and loop.writer.wait():
        loop.host.job_finished()
        log.info("job %s finished after step %d", loop.records.out.job, last)
