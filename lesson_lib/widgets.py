"""ipywidgets controls. Each control calls a library function; none holds course logic itself."""

from __future__ import annotations

from typing import Callable

import ipywidgets as W

from .costmodel import PRECISIONS, accelerators, devices_needed, memory_bill
from .runtime.output import notice_scope, reserve


def memory_calculator(params: float = 1.5e9, precision: str = "mixed-precision Adam") -> W.VBox:
    """Parameters and precision → bytes of model state, and the devices it fits on (chapter 0)."""
    # A fine step, so that the slider keeps the value it was given (1.5e9, not 10^9.2 = 1.58e9).
    p = W.FloatLogSlider(value=params, base=10, min=6, max=12.5, step=0.001, description="parameters",
                         readout_format=".3g", layout={"width": "520px"})
    prec = W.Dropdown(options=list(PRECISIONS), value=precision, description="training")
    out = W.HTML()

    def update(*_):
        bill = memory_bill(p.value, prec.value)
        rows = "".join(f"<tr><td>{k}</td><td style='text-align:right'>{bill[k] / 1e9:,.1f} GB</td></tr>"
                       for k in ("params", "grads", "optimizer"))
        devs = "".join(
            f"<tr><td>{d['device']}</td><td>{'fits' if bill['total'] <= d['bytes'] else 'does not fit'}"
            f"</td><td style='text-align:right'>{devices_needed(bill['total'], d['bytes'])}</td></tr>"
            for d in accelerators())
        out.value = (
            f"<b>{p.value:.3g} parameters × {bill['bytes_per_param']} bytes = "
            f"{bill['total'] / 1e9:,.1f} GB of model state</b> (activations come on top)"
            f"<table>{rows}</table><br><table style='border-spacing:1.5em 0'><tr><th>device</th>"
            f"<th>on one device</th><th>devices if split perfectly</th></tr>{devs}</table>")

    p.observe(update, "value")
    prec.observe(update, "value")
    update()
    return W.VBox([p, prec, out])


def run_button(description: str, controls: dict[str, W.Widget], action: Callable[..., object]) -> W.VBox:
    """Controls plus a button; a click calls ``action(**values)`` and shows what it displays.

    Runs happen on a click, never on every slider move: each run starts real processes.
    """
    button = W.Button(description=description, button_style="primary")
    out = W.Output()
    # One label width for all, wide enough for the longest ("micro-batches" was cut to "micro-bat…").
    longest = max((len(getattr(w, "description", "") or "") for w in controls.values()), default=0)
    for w in controls.values():
        if hasattr(w, "style") and hasattr(w.style, "description_width"):
            w.style.description_width = f"{max(longest, 8) + 1}ch"

    # before the first click, a line where the run's figures will be, not an empty area
    out.outputs = ({"output_type": "display_data", "metadata": {},
                    "data": {"text/plain": f"Press {description}: each click runs on real ranks; its figures "
                                           "appear here."}},)

    def click(_):
        out.clear_output(wait=True)
        with out, notice_scope(object()):
            reserve()  # the clusters' banners above the figures this run shows, not among them
            action(**{k: w.value for k, w in controls.items()})

    button.on_click(click)
    return W.VBox([*controls.values(), button, out])
