"""The packing simulator library used by `gpupack simulate`, the bench and `gpupack report`.

Traces and workloads, submission protocols, the simulated decision loop, churn and packing metrics.
"""
