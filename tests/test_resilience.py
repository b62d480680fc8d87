"""Chapter 10's library: the failure formulas against numbers worked by hand, our per-step fault
tolerance with a replica SIGKILLed mid-exchange against a replay written here, torchft equal to it and
its DiLoCo equal to a single-process simulation written here, every server on loopback, and nothing
left behind. The replays share no code with what they check beyond the task's data and first weights."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.nn.functional as F

from lesson_lib.milestones.resilience import failures, ft_step, torchft_glue
from lesson_lib.milestones.resilience import task as T
from lesson_lib.runtime import replicas

pytestmark = pytest.mark.ch10


def test_young_daly_and_goodput_by_hand():
    assert failures.job_mtbf_h(50_000, 4096) == pytest.approx(12.207, abs=1e-3)
    assert failures.young(300, 43_945.3125) == pytest.approx(5134.9, abs=0.1)  # √(2·300·43,945)
    # Daly: 5,134.9 · (1 + ⅓·√0.0034133 + ⅑·0.0034133) − 300
    assert failures.daly(300, 43_945.3125) == pytest.approx(5134.9 * (1 + 0.058424 / 3 + 0.0034133 / 9) - 300,
                                                            abs=0.5)
    assert failures.daly(100, 40) == 40  # δ ≥ 2M: checkpoint every M
    # τ = 3600, δ = 60, M = 36,000, R = 600: (1 − (600 + 1830)/36,000) · 3600/3660
    assert failures.goodput(3600, 60, 36_000, 600) == pytest.approx((1 - 2430 / 36_000) * 3600 / 3660)
    assert failures.device_mtbf_from(419, 16_384, 54 * 24) == pytest.approx(50_677, abs=1)
    best = failures.young(60, 36_000)
    assert all(failures.goodput(best, 60, 36_000, 0) >= failures.goodput(best * f, 60, 36_000, 0) - 1e-4
               for f in (0.5, 0.8, 1.25, 2))  # Young's τ is (to first order) the best


def test_seconds_of_checkpoint_and_ten_minutes_of_restart_keep_90_percent_by_hand():
    # issue 57: δ = 5 s with R = 10 min, Llama 3's job MTBF: 16,384 GPUs × 1,296 h / 419 failures per GPU,
    # so M = 1,296 · 3,600 / 419 = 11,135.1 s; τ = √(2 · 5 · 11,135.1) = 333.69 s
    m = 1296 * 3600 / 419
    tau = (2 * 5 * m) ** 0.5
    assert failures.young(5, m) == pytest.approx(333.69, abs=0.01)
    # (1 − (600 + 338.69 / 2) / 11,135.1) · 333.69 / 338.69 = 0.93090 · 0.98524 = 0.9172
    assert failures.goodput(tau, 5, m, 600) == pytest.approx(0.9172, abs=1e-4)
    w = failures.waste(tau, 5, m, 600)  # 5 / 338.69; 169.35 / 11,135.1; 600 / 11,135.1
    assert (w["checkpoints"], w["lost work"], w["restarts"]) == pytest.approx((0.014763, 0.015208, 0.053884),
                                                                              abs=1e-6)
    # δ = 10 min: even with R = 0, τ = √(2·600·11,135.1) = 3,655.4 s loses (4,255.4/2)/11,135.1 = 19.1 %
    assert failures.goodput(failures.young(600, m), 600, m, 0) == pytest.approx(
        (1 - 4255.4 / 2 / m) * 3655.4 / 4255.4, abs=1e-4)


def test_the_chapter_states_the_goodput_the_code_computes():
    # the prose's formula is the code's: half an interval (τ + δ)/2 lost per failure, not τ/2
    text = (Path(__file__).resolve().parent.parent / "notebooks" / "scripts" / "10_resilience.py").read_text()
    assert "(1 − (R + (τ + δ)/2)/M) · τ/(τ + δ)" in text and "(R + τ/2)/M" not in text
    # recovery from an in-memory replica is Gemini's report (2023, §3), not a Pathways publication
    assert "Pathways before it" not in text and "Gemini Team, 2023, §3" in text
    assert failures.goodput(100, 10, 10_000, 50) == pytest.approx((1 - (50 + 110 / 2) / 10_000) * 100 / 110)


def test_a_checkpoint_saved_three_ways_reads_back_bit_equal(tmp_path):
    from lesson_lib import warm_cluster

    outs = warm_cluster(2).run(failures.save_job, str(tmp_path), 1000, 1)
    assert all(o["async_equal"] and o["peer_equal"] for o in outs)
    assert [o["peer_bytes"] for o in outs] == [2 * 1000 * 4] * 2  # params + momentum, fp32, one shard
    assert sorted(os.listdir(tmp_path)) == ["async0", "sync0"]


def test_a_short_quorum_is_a_smaller_batch_at_the_same_learning_rate():
    from lesson_lib.chapters import ch10

    task = T.Task(steps=4)
    log = [{"step": 0, "members": [0, 1]}, {"discarded": 1, "members": [0, 1]}, {"step": 1, "members": [0]},
           {"step": 2, "members": [0, 1]}]
    survived = {"out": {"deaths": [{"replica": 1}], "results": [{"log": log}, {"log": []}]}}
    rows = ch10.quorum_batch(task, survived)
    b = task.batch
    assert [(r["step"], r["batch"]) for r in rows] == [(0, 2 * b), (1, b), (2, 2 * b)]
    assert [r["linear_rule_lr"] for r in rows] == [task.lr, task.lr / 2, task.lr]


def _without_it_until_healed(log, victim, killed_in, healed_at, key="step"):
    """The survivor's committed steps from the one it discarded on: without the victim before the
    heal, with it from then on, none missing. How many went without it depends on how soon the spare
    started (none, when it joined the redone step); this holds in every run."""
    done = [e for e in log if key in e and e[key] >= killed_in]
    assert killed_in <= healed_at and [e[key] for e in done] == list(range(killed_in, killed_in + len(done)))
    assert [victim in e["members"] for e in done] == [e[key] >= healed_at for e in done], log


def _replay(task, log):
    """One process, by hand: each committed step averages its members' gradients in member order,
    then SGD with momentum written out (buf = μ·buf + g; p −= lr·buf)."""
    train, _ = T.data(task)
    model, _ = T.build(task)
    params = [p.detach().clone() for p in model.parameters()]
    bufs = [None] * len(params)
    for entry in log:
        if "step" not in entry:
            continue
        grads = []
        for m in entry["members"]:
            ps = [p.clone().requires_grad_() for p in params]
            x, y = T.batch(task, train, entry["step"], m)
            F.cross_entropy(torch.func.functional_call(model, dict(zip(
                [n for n, _ in model.named_parameters()], ps)), (x,)), y).backward()
            grads.append([p.grad for p in ps])
        avg = [sum(g[i] for g in grads) / len(grads) for i in range(len(params))]
        for i, g in enumerate(avg):
            bufs[i] = g.clone() if bufs[i] is None else task.momentum * bufs[i] + g
            params[i] = params[i] - task.lr * bufs[i]
    return torch.cat([p.reshape(-1) for p in params])


def _leftovers():
    return glob.glob(os.path.join(tempfile.gettempdir(), f"lesson_lib_ch10_{os.getpid()}_*"))


def _listening(pids):
    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}


def _tree():
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.children(recursive=True))}


@pytest.mark.parametrize("n", [2, 3])
def test_a_replica_killed_mid_exchange_is_survived_and_healed(n, no_orphans):
    task = T.Task(steps=16)  # the small MLP: the last step waits for every replica, the returner too
    before = set(_leftovers())
    out = replicas.run(ft_step.replica, n, task, (1, 4), restart=(1,), timeout_s=120, restart_after_s=0.3,
                       watch=lambda s, a, st: ft_step.lighthouse(s, a, st, n, task.steps - 1))
    assert [d["exitcode"] for d in out["deaths"]] == [-9]
    res = out["results"]
    assert all(torch.equal(r["params"], res[0]["params"]) for r in res)  # the returner bit-equal
    log = res[0]["log"]
    assert {"discarded": 4, "members": list(range(n))} in log  # the step with the vanished peer
    healed = next(e for e in res[1]["log"] if "healed_at" in e)
    _without_it_until_healed(log, 1, 4, healed["healed_at"])  # the others went on without it
    torch.testing.assert_close(_replay(task, log), res[0]["params"], rtol=1e-6, atol=1e-7)
    assert set(_leftovers()) <= before


def test_torchft_equals_ours_and_listens_on_loopback_only(no_orphans):
    task = T.Task(steps=5)
    ours = replicas.run(ft_step.replica, 2, task, watch=lambda s, a, st: ft_step.lighthouse(s, a, st, 2))
    seen = set()

    def watch(store, alive, stop):
        while not stop.is_set():
            seen.update(_listening(_tree()))
            time.sleep(0.05)

    with torchft_glue.lighthouse(2) as addr:
        ft = replicas.run(torchft_glue.replica, 2, task, addr, watch=watch)
    assert all(torch.equal(r["params"], ours["results"][0]["params"]) for r in ft["results"])
    assert len(seen) >= 4, seen  # the Lighthouse, two Managers' servers and stores, Gloo: really listed
    assert {ip for ip, _ in seen} <= {"127.0.0.1"}, seen


def _diloco_by_hand(task, h, lr, mu):
    """Two replicas in one process: inner SGD by torch, the outer Nesterov step written out."""
    train, _ = T.data(task)
    models = [T.build(task) for _ in range(2)]
    start = T.flat_params(models[0][0]).clone()
    buf = torch.zeros_like(start)
    sent = 0
    for step in range(task.steps):
        for r, (model, opt) in enumerate(models):
            T.gradient(model, T.batch(task, train, step, r))
            opt.step()
        if (step + 1) % h == 0:
            delta = sum(start - T.flat_params(m) for m, _ in models) / 2
            sent += start.numel()
            buf = mu * buf + delta if step + 1 > h else delta.clone()
            start = start - lr * (delta + mu * buf)
            for m, _ in models:
                torch.nn.utils.vector_to_parameters(start.clone(), m.parameters())
    return start, sent


def test_torchft_diloco_equals_the_outer_step_by_hand(no_orphans):
    task = T.Task(steps=12)
    with torchft_glue.lighthouse(2) as addr:
        ft = replicas.run(torchft_glue.diloco, 2, task, addr, 4, 0.7, 0.9)["results"]
    want, sent = _diloco_by_hand(task, 4, 0.7, 0.9)
    for r in ft:
        torch.testing.assert_close(r["params"], want, rtol=1e-5, atol=1e-6)
        assert r["floats_sent"] == sent == 3 * want.numel()  # one exchange per H = 4 steps


def _streaming_by_hand(task, h, lr, mu, delay):
    """Streaming DiLoCo, two replicas in one process, two fragments (layer 1's weight and bias, then
    layer 2's) as slices of the flat weights: fragment k % 2 syncs every h/2 steps, its averaged
    pseudo-gradient taken ``delay`` steps before it is applied; Nesterov written out; alpha 0."""
    train, _ = T.data(task)
    models = [T.build(task) for _ in range(2)]
    w0 = T.flat_params(models[0][0]).clone()
    cut = 32 * task.hidden + task.hidden  # layer 1's weight and bias
    parts = [slice(0, cut), slice(cut, w0.numel())]
    start, buf = [w0[s].clone() for s in parts], [None, None]
    local, synced, delta, sent = 0, 0, None, []
    for step in range(task.steps):
        for r, (model, opt) in enumerate(models):
            T.gradient(model, T.batch(task, train, step, r))
            opt.step()
        local += 1
        k = synced % 2
        if local == h // 2 - delay:
            delta = sum(start[k] - T.flat_params(m)[parts[k]] for m, _ in models) / 2
            sent.append(delta.numel())
        if local == h // 2:
            buf[k] = delta.clone() if buf[k] is None else mu * buf[k] + delta
            start[k] = start[k] - lr * (delta + mu * buf[k])
            for m, _ in models:
                flat = T.flat_params(m).clone()
                flat[parts[k]] = start[k]
                torch.nn.utils.vector_to_parameters(flat, m.parameters())
            synced, local = synced + 1, 0
    return [T.flat_params(m) for m, _ in models], sent  # fragment 0 drifted apart since its last sync


def test_torchft_streaming_diloco_equals_fragments_by_hand(no_orphans):
    task = T.Task(steps=12)
    with torchft_glue.lighthouse(2) as addr:
        ft = replicas.run(torchft_glue.diloco, 2, task, addr, 4, 0.7, 0.9, 2, 1, 0.0)["results"]
    want, sent = _streaming_by_hand(task, 4, 0.7, 0.9, delay=1)
    assert sent == [32 * task.hidden + task.hidden, task.hidden * 10 + 10] * 3  # the layers take turns
    for r, mine in zip(ft, want):
        torch.testing.assert_close(r["params"], mine, rtol=1e-5, atol=1e-6)
        assert r["floats_sent"] == sum(sent) == 3 * mine.numel()


@pytest.mark.slow
def test_torchrun_restarts_every_worker_and_they_resume_from_the_checkpoint():
    from lesson_lib.milestones.resilience import elastic

    out = elastic.run(steps=6, crash_at=3)
    assert out["returncode"] == 0, out["log"]
    runs = [(r["attempt"], r["rank"], r["ran"]) for r in out["runs"]]
    assert runs == [(1, 0, [3, 4, 5]), (1, 1, [3, 4, 5])]
    # 6 steps of w −= 0.1 · (1 + 2) / 2, from 0: −0.9, as if nothing had failed
    assert all(v == pytest.approx(-0.9, abs=1e-6) for r in out["runs"] for v in r["w"])
    assert not _leftovers()


def test_a_failed_launch_leaves_nothing(no_orphans):
    def boom(me, n, path):
        raise RuntimeError("no")

    before = set(_leftovers())
    with pytest.raises(RuntimeError, match=r"^replica [01]: RuntimeError: no\n") as e:  # its own words
        replicas.run(boom, 2, timeout_s=60)
    assert 'raise RuntimeError("no")' in str(e.value)  # and its line
    assert set(_leftovers()) <= before


NETNS = shutil.which("ip") and os.geteuid() == 0 and shutil.which("tc")


@pytest.mark.slow
@pytest.mark.skipif(not NETNS, reason="needs root, `ip netns` and `tc` (network namespaces, a veth pair)")
def test_two_machines_in_namespaces_over_a_rate_limited_veth(tmp_path):
    """Two 'machines' (network namespaces) joined by a veth pair limited to 100 Mbit/s with tbf:
    torchrun with Gloo crosses it, then two torchft replica groups (the Lighthouse in the first); the
    addresses exist inside the namespaces only."""
    tag = f"c10{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(2_000_000)
        dist.all_reduce(t)
        t0 = time.perf_counter(); dist.all_reduce(t); s = time.perf_counter() - t0
        assert float(t[0]) == 4.0
        if dist.get_rank() == 0:
            print(f"SECONDS {s:.3f}")
        dist.destroy_process_group()
    """))
    run = lambda *c: subprocess.run(c, check=True, capture_output=True, text=True)
    try:
        run("ip", "netns", "add", a)
        run("ip", "netns", "add", b)
        run("ip", "link", "add", f"{tag}x", "netns", a, "type", "veth", "peer", "name", f"{tag}y", "netns", b)
        for ns, dev, ip in ((a, f"{tag}x", "10.77.0.1/24"), (b, f"{tag}y", "10.77.0.2/24")):
            run("ip", "-n", ns, "addr", "add", ip, "dev", dev)
            run("ip", "-n", ns, "link", "set", dev, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "100mbit",
                "burst", "64kb", "latency", "50ms")
        procs = []
        for rank, (ns, dev) in enumerate(((a, f"{tag}x"), (b, f"{tag}y"))):
            env = {**os.environ, "GLOO_SOCKET_IFNAME": dev, "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                 "--nproc-per-node", "1", "--node-rank", str(rank), "--master-addr", "10.77.0.1",
                 "--master-port", "29555", str(script)], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=240)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        seconds = float(outs[0].split("SECONDS ")[1].split()[0])
        assert seconds > 8e6 * 8 / 100e6 * 0.8, outs[0]  # 8 MB each way at 100 Mbit/s: the limit held
        ft = tmp_path / "ft.py"
        ft.write_text(textwrap.dedent(f"""
            import hashlib, os, pathlib, shutil, sys, tempfile, time
            from lesson_lib.milestones.resilience import task as T, torchft_glue as G
            rank, host, shared = int(sys.argv[1]), sys.argv[2], pathlib.Path({str(tmp_path)!r})
            d = tempfile.mkdtemp()
            def go(addr):
                out = G.replica(rank, 2, os.path.join(d, "s"), T.Task(steps=4), addr, host=host)
                print("PARAMS", hashlib.sha256(out["params"].numpy().tobytes()).hexdigest(), flush=True)
            try:
                if rank == 0:
                    with G.lighthouse(2, host=host) as addr:
                        (shared / "lh").write_text(addr)
                        go(addr)
                        while not (shared / "done").exists():
                            time.sleep(0.05)
                else:
                    while not (shared / "lh").exists():
                        time.sleep(0.05)
                    go((shared / "lh").read_text())
                    (shared / "done").write_text("")
            finally:
                shutil.rmtree(d)
        """))
        procs = []
        for rank, (ns, dev, ip) in enumerate(((a, f"{tag}x", "10.77.0.1"), (b, f"{tag}y", "10.77.0.2"))):
            env = {**os.environ, "GLOO_SOCKET_IFNAME": dev, "OMP_NUM_THREADS": "1", "RUST_LOG": "warn"}
            cmd = ["ip", "netns", "exec", ns, sys.executable, str(ft), str(rank), ip]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, cwd=Path(__file__).resolve().parents[1]))
        outs = [p.communicate(timeout=240)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        hashes = [o.split("PARAMS ")[1].split()[0] for o in outs]
        assert hashes[0] == hashes[1], outs  # the two replica groups agree, across the limited veth
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert a not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.slow  # waits out torchft's heartbeat timeout
def test_torchft_survives_a_replica_killed_mid_step_and_heals_it(no_orphans):
    """torchft's Manager.allreduce (not its DDP wrapper): replica 1 SIGKILLed after its gradient, before
    the exchange; replica 0 waits for the heartbeat, goes on alone, and the spare heals from it."""
    task = T.Task(steps=48, hidden=2048, batch=512)
    with torchft_glue.lighthouse(2, heartbeat_timeout_ms=2000) as addr:
        out = replicas.run(torchft_glue.replica, 2, task, addr, (1, 4), restart=(1,), restart_after_s=0.3,
                           timeout_s=240)
    assert [d["exitcode"] for d in out["deaths"]] == [-9]
    a, b = out["results"]
    assert torch.equal(a["params"], b["params"])  # the returner bit-equal at the end
    assert any("healed_at" in e for e in b["log"])
    assert {"discarded": 4} in a["log"]  # should_commit() was False: the step with the dead peer dropped
    steps = sorted(t["s"] for t in a["times"])
    assert steps[-1] > 4 * steps[len(steps) // 2]  # the stall: a new quorum without the dead peer
    assert any(e.startswith("step 4: ") for e in a["torchft_errors"])  # the error it survived, kept


@pytest.mark.slow  # starts replica processes twice
def test_diloco_survives_a_replica_killed_mid_exchange_and_heals_it(no_orphans):
    """ft_diloco: without a failure, both replicas equal two replicas written out in one process
    (``_diloco_by_hand``, the outer Nesterov step written out); with
    replica 1 SIGKILLed mid-exchange in outer step 2, the round is discarded by the survivor, which goes
    on alone, the spare heals from it, and both end bit-equal."""
    from lesson_lib.milestones.resilience import ft_diloco

    task, h = T.Task(steps=24), 4
    watch = lambda s, a, st: ft_step.lighthouse(s, a, st, 2, task.steps // h - 1)
    clean = replicas.run(ft_diloco.replica, 2, task, h, 0.5, 0.5, watch=watch, timeout_s=120)["results"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each replica runs: the matmuls then add in the same order, bit for bit
    try:
        ref, sent = _diloco_by_hand(task, h, 0.5, 0.5)  # the reference torchft's DiLoCo is held to above
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(r["params"], ref) for r in clean)
    assert clean[0]["floats_sent"] == sent == (task.steps // h) * ref.numel()
    out = replicas.run(ft_diloco.replica, 2, task, h, 0.5, 0.5, (1, 2), restart=(1,), restart_after_s=0.1,
                       watch=watch, timeout_s=120)
    a, b = out["results"]
    assert [d["exitcode"] for d in out["deaths"]] == [-9]
    assert {"discarded": 2, "members": [0, 1]} in a["log"]
    healed = next(e for e in b["log"] if "healed_at" in e)
    assert healed["from"] == 0
    _without_it_until_healed(a["log"], 1, 2, healed["healed_at"], key="outer_step")  # redone, alone or not
    assert torch.equal(a["params"], b["params"])
