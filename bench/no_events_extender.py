"""A diagnostic of the throughput bench (#32): gpupack itself, with its `Assigned` event per bind switched off.

Not a configuration: #18 makes an `Assigned` event per bind part of what gpupack does. Run beside `gpupack`
and `minimal` (`python -m gpupack.bench.throughput_cli --extenders minimal,gpupack,gpupack-no-events`), it
measures what those events cost the rig (gpupack's writer thread, the API server, etcd), so the report can
tell that cost from the cost of gpupack's decisions, state and watches. Everything else is `gpupack serve`.

    python -m gpupack.bench.no_events_extender --kubeconfig PATH --host HOST --port PORT
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpupack.extender.pod_events import PodEvents, PodRef
from gpupack.extender.service import serve
from gpupack.scoring.facts import Placement


def _no_assigned_event(self: PodEvents, pod: PodRef, placement: Placement) -> None:
    """What `PodEvents.assigned` does here: nothing (failures' events stay as they are)."""


def main(argv: Sequence[str] | None = None) -> int:
    """`gpupack serve --kubeconfig --host --port` (the rest at its defaults), without `Assigned` events."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    args.cluster_file = args.config = args.tls_cert = args.tls_key = None  # what `gpupack serve` leaves unset
    PodEvents.assigned = _no_assigned_event  # type: ignore[method-assign]  # the diagnostic's one change
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
