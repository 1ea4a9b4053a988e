"""`gpupack report`: what a cluster's GPUs cost and waste now, and what to do about it (#16).

Pure computation (cost split, pools, stranding) lives in `gpupack.scoring.cost` and
`gpupack.scoring.pools`; this package reads a cluster through the extender's own readers, plans
drains with the scoring engine, and renders the result as a table, JSON or an HTML page.
"""
