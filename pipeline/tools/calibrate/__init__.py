"""Measuring the cost model on the training device (``mixflow calibrate``).

One transformer block is timed forward and backward over packed micro-batches of several sample
lengths (``timing``, ``block``: torch, imported only there), and ``alpha``, ``beta`` and ``gamma`` of
``alpha*L^2 + beta*L + gamma`` are fitted to the times (``fit``: numpy alone), then written as the
spec's ``cost:`` section (``section``).
"""

from pipeline.tools.calibrate.fit import CostFit, Timing, fit_cost
from pipeline.tools.calibrate.grid import MicroBatchShape, calibration_grid, default_lengths
from pipeline.tools.calibrate.section import cost_section, fit_table

__all__ = [
    "CostFit",
    "MicroBatchShape",
    "Timing",
    "calibration_grid",
    "cost_section",
    "default_lengths",
    "fit_cost",
    "fit_table",
]
