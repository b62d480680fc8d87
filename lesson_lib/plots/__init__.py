"""Every figure of the course is drawn here, from data a milestone returned (or streams).

A milestone returns data; a plot draws data. Live figures are plotly ``FigureWidget`` objects fed
by worker events; under nbval (no browser) the same code runs and simply renders nothing live.
Where ranks outnumber cores, figures say so and show per-rank busy time beside wall time.
One module per part of the story; chapters use the names re-exported here (``plots.timeline``).
"""

from .collectives import (  # noqa: F401
    ALG_COLORS,
    allreduce_bandwidth,
    bytes_per_rank,
    model_scaling,
    ring_animation,
    ring_vs_parameter_server,
)
from .common import (  # noqa: F401
    COLORS,
    LiveRuns,
    oversubscription_note,
)
from .memory import (  # noqa: F401
    fits_table,
    gradient_peaks,
    memory_vs_formula,
    stage_traffic,
)
from .pipeline import (  # noqa: F401
    PIPE_COLORS,
    LiveGantt,
    activation_peaks,
    bubble_vs_microbatches,
    pipeline_gantt,
    stage_params,
)
from .training import (  # noqa: F401
    PHASE_COLORS,
    busy_idle,
    comm_share,
    comm_vs_size,
    loss_curves,
    memory_by_category,
    model_growth,
    overlap_timeline,
    staleness_histogram,
    step_times,
    time_split,
    timeline,
    traffic_vs_formula,
)
