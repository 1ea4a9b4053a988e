"""The physical limit of packing a trace: a pattern-LP bound and an offline packing (docs/limit.md).

`instance` reduces the pods that arrived by 100 % to GPU shapes and the nodes to node types; `pattern_lp`
bounds, by column generation over node and GPU patterns, the GPU milli any scheduler could place; `packing`
turns an integer solution over the same patterns into placements on the real nodes, each one committed to
the simulator's inventory. Needs SciPy (HiGHS): the `bench` extra only.
"""
