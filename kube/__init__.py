"""The Kubernetes object layer shared by the extender, the agent, the simulator and the report.

Resource keys, quantities, pod requests, node facts, MIG layouts, object builders and list/watch sources.
"""
