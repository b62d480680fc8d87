"""Chapter 1 §6: a replicated server shard survives its primary's death
(notebooks/01_parameter_server.ipynb). ``ch01`` re-exports it."""

from __future__ import annotations

from dataclasses import replace

import torch
from IPython.display import display

from .. import numerics, plots
from ..milestones.parameter_server import replicas as pr
from ..runtime import warm_cluster


def replicated_failover(workers: int = 2, fail_at: int = 5) -> dict:
    """The same synchronous training twice on workers + 2 server ranks: once with the primary gone
    at step ``fail_at``, once without; the single-process losses beside them; bytes by kind."""
    cfg = pr.Config.laptop(workers=workers, fail_at=fail_at).validate()
    cluster = warm_cluster(cfg.world_size)
    failed, intact = pr.run(cfg, cluster), pr.run(replace(cfg, fail_at=-1), cluster)
    ref = pr.reference(cfg)
    s = failed["param_bytes"]
    display(plots.consistency.failover(
        {f"primary gone at step {fail_at}": failed["losses"], "no failure": intact["losses"],
         "one process": ref}, fail_at, failed,
        f"{workers} workers, a shard on a primary and a backup: the primary leaves at step {fail_at}"))
    same = torch.equal(failed["params"], intact["params"])
    print(f"the backup took over at step {failed['took_over']}; every worker found there the parameters it "
          f"already had: {all(w['same_params'] for w in failed['switched'])}\n"
          f"final parameters equal to the run without failure, bit for bit: {same}\n"
          f"largest loss gap from one process: {numerics.max_gap(failed['losses'], ref):.1e}\n"
          f"replication: {failed['replication_bytes']:,} bytes counted = "
          f"{failed['acknowledged_by_primary']} acknowledged steps × (S + 8) = "
          f"{failed['replication_formula']:,}\n"
          f"per step: S + 8 = {s + 8:,} bytes beside the server's 2·N·S = {2 * workers * s:,} "
          f"({(s + 8) / (2 * workers * s):.0%} more)")
    return {"failed": failed, "intact": intact, "reference": ref, "same_params": same}
