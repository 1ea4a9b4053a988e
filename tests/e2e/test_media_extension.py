"""A `nvidia.com/mig-1g.10gb.me` request on a static-MIG node gets the `+me` instance, not a plain one (#12)."""

from __future__ import annotations

import json

from tests.e2e.catalogue import H100, mig, pods_of, static_mig_node
from tests.e2e.cluster import E2ECluster

# The media-extension instance is not the first free 1g.10gb: a placement that ignores `+me` takes slice 0.
LAYOUT = {"0": ["1g.10gb@0", "1g.10gb@1", "1g.10gb+me@2", "3g.40gb@4"]}


def test_a_media_extension_request_lands_on_the_media_extension_instance(cluster: E2ECluster) -> None:
    cluster.add_nodes([static_mig_node(f"{cluster.prefix}-h100-mig-static-0", H100, LAYOUT, "on-demand", 12.29)])
    media = cluster.create_pods(pods_of([mig(1, "1g.10gb.me")]))
    cluster.wait_all_bound(media)
    plain = cluster.create_pods(pods_of([mig(2, "1g.10gb")]))
    cluster.wait_all_bound(plain)

    assert cluster.assignment_problems() == []
    assignments = {
        p["metadata"]["name"]: json.loads(p["metadata"]["annotations"]["gpupack.io/assignment"]) for p in cluster.pods()
    }
    assert [(slot["mig"], slot["start"]) for slot in assignments[media[0]]["gpus"]] == [("1g.10gb+me", 2)]
    assert sorted(assignments[name]["gpus"][0]["start"] for name in plain) == [0, 1]
