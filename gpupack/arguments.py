"""Argument types shared by gpupack's command lines (`gpupack`, `python -m gpupack.bench.tune`): clear refusals."""

from __future__ import annotations

import argparse


def seed_list(text: str) -> list[int]:
    """`42-51` or `42,43,50` -> list of seeds."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                low, high = part.split("-", 1)
                seeds.extend(range(int(low), int(high) + 1))
            else:
                seeds.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must look like 42-51 or 42,43: {text!r}") from None
    return seeds


def port_number(text: str) -> int:
    """A TCP port number, 1..65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 1..65535")
    return port
