"""Formulas used to reason beyond this laptop: the memory bill of training, and (from chapter 2 on)
the alpha-beta model of communication. Formulas live here; measurements live in ``metrics``.
"""

from __future__ import annotations

from .data import read_csv

# Bytes per parameter for each part of the model state (Rajbhandari et al., ZeRO, 2020, §3.1):
# mixed-precision Adam keeps fp16 params and grads (2 + 2 bytes) plus an fp32 master copy,
# momentum and variance (4 + 4 + 4 bytes): K = 12 bytes of optimizer state, 16 bytes in all.
PRECISIONS = {
    "fp32 Adam": {"params": 4, "grads": 4, "optimizer": 8},
    "mixed-precision Adam": {"params": 2, "grads": 2, "optimizer": 12},
    "fp32 SGD + momentum": {"params": 4, "grads": 4, "optimizer": 4},
}


def memory_bill(params: float, precision: str = "mixed-precision Adam") -> dict:
    """Bytes of model state (params, grads, optimizer) to train ``params`` parameters on one device.

    Activations come on top and depend on batch and sequence length, so they are not included.
    Used by chapter 0 (the memory calculator) and chapter 4 (ZeRO divides these by N).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not params >= 0:
        raise ValueError(f"params must be a non-negative number, got {params!r}")
    per = PRECISIONS[precision]
    bill = {k: v * params for k, v in per.items()}
    bill["total"] = sum(bill.values())
    bill["bytes_per_param"] = sum(per.values())
    return bill


def accelerators() -> list[dict]:
    """Devices from data/accelerators.csv (checksum-verified) with their memory in bytes."""
    return [{"device": r["device"], "bytes": float(r["memory_gb"]) * 1e9, "source": r["source"]}
            for r in read_csv("accelerators.csv")]


def fits(total_bytes: float) -> dict[str, bool]:
    """Which devices hold ``total_bytes`` of model state (ignoring activations and fragmentation)."""
    return {d["device"]: total_bytes <= d["bytes"] for d in accelerators()}


def devices_needed(total_bytes: float, device_bytes: float) -> int:
    """How many devices of ``device_bytes`` the state needs if it could be split perfectly."""
    return max(1, -(-int(total_bytes) // int(device_bytes)))
