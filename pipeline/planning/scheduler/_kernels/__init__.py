"""The scheduler's numba kernels and the state they share, by concept.

- ``state``: the arguments checked at the Python boundary, the step's samples and grid, and a placement.
- ``greedy``: the first pass: the candidates' order, plain LPT, the prefix plan and the top-up.
- ``repair``: the guarantee against starvation (the swap repair).
- ``rebalance``: moves of placed samples off the costliest ranks.
- ``trades``: exchanges of placed samples between ranks, with two capacities (the total and the encoder's part).
- ``step``: the plan of one step, from the passes above, in one kernel.
- ``blocks``: context-parallel samples onto blocks of ranks, placed before a step's other samples.
"""
