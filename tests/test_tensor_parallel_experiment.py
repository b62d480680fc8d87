"""Chapter 8 as a registered experiment (``tensor-parallel``): the run every milestone takes (Config →
Cluster.run(worker) → summarize → Result) equals one process at two layouts; each rank's record is
typed (GridRankResult) in the Result and its JSON; a bad layout is refused naming the parameter before
any rank starts; the command line runs it and writes the JSON."""

import json
import math

import pytest
import torch
from conftest import cli_in_process

from lesson_lib import experiments
from lesson_lib.milestones.tensor_parallel import GridRankResult, tolerances
from lesson_lib.milestones.tensor_parallel import milestone as tp_milestone
from lesson_lib.numerics import max_gap

pytestmark = pytest.mark.ch8
NAME = "tensor-parallel"


def test_it_is_registered_with_the_milestone_shape():
    assert NAME in experiments.names()
    mod = experiments.load(NAME)
    assert mod is tp_milestone and mod.NAME == NAME
    for attr in ("Config", "worker", "summarize", "reference"):
        assert callable(getattr(mod, attr)), attr
    cfg = mod.Config.tiny()
    assert experiments.experiment_of(cfg) == NAME
    assert (cfg.layout().dp, cfg.layout().pp, cfg.layout().tp) == (1, 1, 2)  # dp = 0: the rest of the grid
    assert mod.Config(world_size=4, pp=2, tp=2).validate().layout().dp == 1


@pytest.mark.numerics
@pytest.mark.parametrize("n, layout", [(2, {"tp": 2, "sequence_parallel": True}),
                                       (4, {"pp": 2, "tp": 2, "microbatches": 2})],
                         ids=["tp2-sp", "pp2-tp2"])
def test_the_registered_run_equals_one_process_and_types_every_rank(n, layout, clusters, tmp_path):
    cfg = tp_milestone.Config(world_size=n, steps=3, **layout).validate()
    r = experiments.run(NAME, cfg, cluster=clusters(n))
    ref = tp_milestone.reference(cfg)
    # the reference runs none of the parallel code: one process, the unsharded Transformer
    allowed = tolerances.transformer_rel(cfg.model()) * max(ref["losses"])
    assert len(r.losses) == cfg.steps
    assert max_gap(r.losses, ref["losses"]) <= allowed, (r.losses, ref["losses"])
    assert r.losses[-1] < r.losses[0]

    ranks = r["grid"]
    assert all(isinstance(g, GridRankResult) for g in ranks) and len(ranks) == n
    lay = cfg.layout()
    where = torch.arange(n).view(lay.dp, lay.pp, lay.tp)
    for g in ranks:  # bug caught: coordinates read by position in the wrong order
        assert where[g.dp_index, g.pp_index, g.tp_index] == g.rank
        assert (g.losses is not None) == (g.pp_index == lay.pp - 1)
        assert g.param_numel == r["stage_params_formula"][g.pp_index] < r["unsharded_params"]
    for group in ("tp", "pp", "dp"):  # counted bytes per step equal the cost model's term
        assert r["bytes_per_step"][group] == r["bytes_per_step_formula"][group], group
    assert (r["bytes_per_step"]["unmodelled"] > 0) == cfg.sequence_parallel
    assert all(p.steps and p.memory["params"] > 0 for p in r.per_rank)

    f = tmp_path / "tp.json"
    r.save_json(f)
    d = json.loads(f.read_text())
    assert d["experiment"] == NAME and d["config"]["tp"] == cfg.tp and d["layout"]["dp"] == lay.dp
    for g, want in zip(d["grid"], ranks):
        assert g == want.to_dict()
        typed = {"rank", "dp_index", "pp_index", "tp_index", "losses", "param_numel", "bytes_per_group"}
        assert typed <= set(g)
        assert GridRankResult(**g) == want  # the JSON's record reads back typed


@pytest.mark.parametrize("n", [2, 4])
def test_a_one_step_run_at_two_world_sizes_finishes_and_summarises(n, clusters):
    cfg = tp_milestone.Config.tiny(steps=1, world_size=n)  # tp = 2, dp the rest
    r = experiments.run(NAME, cfg, cluster=clusters(n))
    assert len(r.losses) == 1 and math.isfinite(r.losses[0])
    assert r.median_step_time() > 0 and r.summary() and r.to_dict()["experiment"] == NAME
    assert {g.dp_index for g in r["grid"]} == set(range(n // 2))


@pytest.mark.parametrize("options, name", [
    ({"pp": 3}, "pp"),                                  # more stages than the 2 layers
    ({"world_size": 3, "pp": 3, "tp": 1, "layers": 4}, "pp"),  # 4 layers do not split 3 ways
    ({"world_size": 3, "tp": 3}, "tp"),                 # 4 heads do not split 3 ways
    ({"world_size": 4, "tp": 4, "ffn": 130}, "tp = 4 does not divide ffn"),
    ({"tp": 2, "sequence_parallel": True, "seq": 15}, "seq"),
    ({"dp": 2, "tp": 2, "world_size": 2}, "world_size"),  # dp · pp · tp = 4 on 2 ranks
    ({"world_size": 3, "tp": 2}, "world_size"),         # no whole dp fills the grid
    ({"world_size": 4, "tp": 1, "global_batch": 6}, "global_batch"),
    ({"microbatches": 3}, "microbatches"),
    ({"d_model": 30}, "d_model"),
    ({"dp": -1}, "dp"),
    ({"backend": "nccl"}, "backend"),
])
def test_a_bad_config_is_refused_naming_the_parameter(options, name):
    with pytest.raises(ValueError, match=name):
        experiments.run(NAME, **options)  # validated before a cluster starts


def test_the_command_line_lists_helps_runs_and_writes_json(tmp_path):
    listed = cli_in_process("list")
    assert listed.returncode == 0 and any(line.startswith(NAME + " ") for line in listed.stdout.splitlines())
    helped = cli_in_process("run", NAME, "--help")
    assert helped.returncode == 0
    for flag in ("--dp", "--pp", "--tp", "--microbatches", "--sequence-parallel", "--world-size"):
        assert flag in helped.stdout, flag
    bad = cli_in_process("run", NAME, "--world-size", "4", "--tp", "3")
    assert bad.returncode == 2 and "tp = 3" in bad.stderr and "Traceback" not in bad.stderr

    f = tmp_path / "out.json"
    out = cli_in_process("run", NAME, "--world-size", "4", "--tp", "2", "--pp", "2", "--steps", "3",
                         "--json", str(f))
    assert out.returncode == 0, out.stderr
    assert "step 3/3" in out.stderr and f"wrote {f}" in out.stdout
    d = json.loads(f.read_text())
    assert d["experiment"] == NAME and d["world_size"] == 4 and len(d["per_rank"]) == 4
    assert d["layout"] == {"dp": 1, "pp": 2, "tp": 2, "microbatches": 2, "sequence_parallel": False}
    assert sorted((g["dp_index"], g["pp_index"], g["tp_index"]) for g in d["grid"]) == \
        [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    ref = tp_milestone.reference(tp_milestone.Config(world_size=4, tp=2, pp=2, steps=3))
    assert max_gap(d["losses"], ref["losses"]) <= tolerances.transformer_rel(
        tp_milestone.Config().model()) * max(ref["losses"])
