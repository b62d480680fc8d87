# ---
# jupyter:
#   jupytext:
#     formats: ipynb,scripts//py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] slideshow={"slide_type": "slide"}
# # Chapter 11 — The room is the cluster
#
# Every chapter so far started its ranks on one machine, from one notebook. This one makes the
# class the cluster. On the workshop server ([docs/workshop.md](../docs/workshop.md)) every
# learner's kernel runs on the same machine, so every learner's kernel can be **one rank of one
# `torch.distributed` world**, and this notebook, the instructor's, is its dashboard. The talk's
# milestones are then played by the room: the instructor is the parameter server and the learners
# its workers; the ring all-reduce runs with each learner's own code as one hop; a learner who stops
# typing is the straggler everyone waits for; a learner who closes their laptop is a failed rank,
# and the room carries on without them, as chapter 10's quorum did.
#
# Learners open [the_room_learner.ipynb](the_room_learner.ipynb). Alone, or to rehearse, leave
# `REHEARSAL = True`: this notebook then starts four learner processes of its own (each a separate
# process that joins the room exactly as a learner's kernel does), one of them with a wrong ring
# step and one a straggler.

# %% [markdown]
# **After this chapter you can:**
#
# 1. open a room in which every learner's kernel is one rank of a real `torch.distributed` world, rendezvous on the server only, and say what another user of the server could still do (§1);
# 2. run the ring with every learner's own reduce-scatter step and read which partial sum went wrong, and from whom first (§2, your step in the learner's notebook);
# 3. play the parameter server with the instructor's kernel serving, sync and async, and measure its load as the room grows against chapter 1's 2·N·S (§3);
# 4. watch the room's step set by its slowest member, a learner who leaves mid-round named and the round discarded, and a returning learner healed from a live peer (§4).
#
# **Before it:** chapters 0 (ranks and all-reduce), 1 (the parameter server), 2 (reduce-scatter by
# hand) and 10 (quorum, discard, heal).
# **Time:** Run All's measured time for each chapter is in [run-all.md](run-all.md), beside this
# notebook; the room's own rounds took under a second each in the course's test (docs/room.md).

# %%
import plotly.graph_objects as go
from IPython.display import display

from lesson_lib import room as rooms
from lesson_lib import show_source
from lesson_lib.room import rehearsal
from lesson_lib.room.dashboard import Dashboard

REHEARSAL = True  # in class: False, and the learners join from the_room_learner.ipynb
ROOM = "tuesday"  # the name you tell the room

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Open the room
#
# `rooms.open` makes the room's folder on this server, readable and writable by the workshop's
# group only, with a `torch.distributed.FileStore` in it: the rendezvous is a file, so no port is
# opened for it. Every round's world is made with `init_process_group("gloo", store=...)` under the
# round's own prefix of that store, with Gloo bound to the loopback interface (`GLOO_SOCKET_IFNAME=lo`):
# nothing the room opens listens beyond 127.0.0.1. In rehearsal the room's folder is a temporary one
# of this kernel's own, removed when the room closes.

# %%
room = rooms.open(ROOM, private=REHEARSAL)
if REHEARSAL:
    learners = room.rehearse(names=["ada", "bob", "cy", "dee"], wrong=["cy"], slow=["dee"], work=4)
print(room.learners())

# %% [markdown] slideshow={"slide_type": "subslide"}
# The dashboard: who joined and what each is doing now (grey ready, blue computing, orange waiting,
# with whom for, green done, red failed, black gone), the last round's numbers, and the room's
# verdicts in large type. One button per round; it redraws while the round runs. The cells below run
# their rounds from code, so that this notebook can assert what each showed; in class, the button is
# all you need.

# %%
dash = Dashboard(room)
display(dash.widget)

# %% [markdown] slideshow={"slide_type": "subslide"}
# A learner's side is two lines, `me = room.join("tuesday")` and `me.submit("ring", my_step)`.
# Their rank is their own kernel process: the room's loop runs in a background thread of it, so
# their code runs where their notebook runs, as their Unix user, their errors come back to them and
# to you with their name and line, and their notebook stays free while the room plays. A rehearsal
# learner runs exactly that, from this file:

# %%
show_source(rehearsal.main)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. The ring, one hop per learner
#
# Chapter 2's exercise was reduce-scatter by hand. Here each learner submits only its **step**:
# `my_step(rank, n, s)` returns which chunk this rank sends to its right at step `s`, and into which
# chunk it adds what arrives from its left. The room's loop around it does the exchange with
# `dist.isend`/`dist.irecv`, on the learner's kernel, and records every hop: what was sent, to whom,
# its time and bytes. The right step, and the slip a learner makes most:

# %%
show_source(rehearsal.my_step)
show_source(rehearsal.my_wrong_step)

# %%
rnd = room.run("ring")
print(rnd.verdict)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The check knows each learner's tensor and works every partial sum a correct ring sends: rank r
# sends, at step s, chunk (r − s) mod n summed over ranks r − s … r. The first message, by step,
# that is not that sum names its sender, and every message before it was right, so the mistake is
# theirs and not inherited. The dashboard draws the ring with each hop's time; the wrong sender's
# arrow is red.

# %%
if REHEARSAL:
    assert not rnd.ok and rnd.summary["wrong"]["learner"] == "cy", rnd.verdict
    learners.fix("cy")  # cy corrects their step (a fresh process with the right one)
rnd = room.run("ring")
print(rnd.verdict)
assert rnd.ok, rnd.verdict
hops = rnd.summary["hops"]
print(f"{len(hops)} hops, {sum(h['bytes'] for h in hops):,} bytes in all, "
      f"the slowest {max(h['seconds'] for h in hops) * 1e3:.2f} ms")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. The parameter server: the instructor serves
#
# The instructor's kernel is rank 0 of this round's world and serves chapter 1's model; each
# learner's kernel is a worker that pulls the weights, computes a gradient on its shard of the
# batch and pushes it. Synchronous first, with one more learner each round: the server's traffic is
# 2·N·S bytes a step (chapter 1's formula), and its step waits for the slowest worker.

# %%
load = []
for n in range(1, len(room.ready()) + 1):
    r = room.run("server", size=n, mode="sync", steps=8)
    assert r.ok, r.verdict
    load.append(r.summary)
    print(r.verdict)
for s in load:  # counted bytes against chapter 1's 2·N·S
    assert s["bytes_per_step"] == 2 * s["workers"] * s["params"] * 4

# %%
fig = go.Figure()
workers = [s["workers"] for s in load]
fig.add_bar(x=workers, y=[s["bytes_per_step"] / 1e3 for s in load],
            name="server's bytes a step, counted (kB)")
fig.add_scatter(x=workers, y=[2 * n * load[0]["params"] * 4 / 1e3 for n in workers], mode="lines+markers",
                name="2·N·S, chapter 1 (kB)")
fig.add_scatter(x=workers, y=[s["median_step_s"] * 1e3 for s in load], mode="lines+markers", yaxis="y2",
                name="median step (ms), measured")
fig.update_layout(title="The server's load grows with the room", xaxis_title="learners (N)",
                  yaxis_title="kB a step", yaxis2={"title": "ms a step", "overlaying": "y", "side": "right"},
                  height=420, legend={"orientation": "h", "y": -0.25})
fig.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# Asynchronous: the server applies each gradient as it arrives (`dist.recv` from any rank) and sends
# that learner fresh weights. Nobody waits for the slowest, and a gradient's staleness is how many
# updates the weights moved while it was computed; the straggler's are the stalest.

# %%
r = room.run("server", mode="async", steps=8)
print(r.verdict)
assert r.ok and max(r.summary["staleness"]) >= 1

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Stragglers and failures
#
# Now every learner trains one data-parallel replica, each step's gradients all-reduced. The room's
# step is as slow as its slowest member. In rehearsal, dee is the straggler: dee's process **really
# computes** each gradient four times over (no sleep); in class it is whoever has not run their cell.

# %%
r = room.run("steps")
print(r.verdict)
if REHEARSAL:
    assert r.summary["slowest"] == "dee", r.verdict

# %% [markdown] slideshow={"slide_type": "subslide"}
# A learner who closes their laptop mid-round: here bob's process is SIGKILLed once bob reaches
# step 3 of a long round. The instructor's kernel checks every member's process every 0.1 s, so bob
# is named at once; the survivors' all-reduce fails with "Connection closed by peer" within about a
# second; the round is discarded (nobody keeps its steps) and the next round goes on without bob.

# %%
if REHEARSAL:
    watcher = learners.kill_when("bob", step=3)
r = room.run("steps", steps=200)
print(r.verdict)
print("\n".join(r.events))
if REHEARSAL:
    watcher.join()
    assert r.discarded and "bob" in r.left, r.verdict
    print(f"bob named {r.left['bob'] - (watcher.killed_at - r.started):.2f} s after the kill")
    r = room.run("steps")
    print(r.verdict)
    assert r.ok and "bob" not in r.members

# %% [markdown] slideshow={"slide_type": "subslide"}
# bob comes back: a fresh kernel with nothing kept. At the start of every round the members
# all-gather how many steps each has, and the first with the most broadcasts its weights: bob is
# healed from a live peer, as chapter 10's replicas were, and every replica ends equal.

# %%
if REHEARSAL:
    learners.rejoin("bob")
r = room.run("steps")
print(r.verdict)
if REHEARSAL:
    assert r.ok and "bob" in r.summary["healed"], r.verdict

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. In class
#
# Set `REHEARSAL = False`, pick the room's name, and run §1; tell the room the name. Each learner
# opens [the_room_learner.ipynb](the_room_learner.ipynb), sets the same name and runs it: they appear
# on the dashboard. Then one button per round, choosing the activity. Whoever has joined and is ready
# when you press takes part; a learner who joins late is in the next round. A learner's exception
# appears on the dashboard with their name and line and never stops the room. A round that waits
# longer than its timeout (20 s by default) ends, naming whom it waited for and what they were doing.
# [docs/room.md](../docs/room.md) has each activity's timing from the course's test and what the room
# protects against and what it does not.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Summary
#
# What showed each of this chapter's objectives:
#
# 1. **one room, one world** — §1's room with each learner's kernel a rank, its store a file only the workshop's group can open, Gloo on loopback, and the dashboard.
# 2. **the ring with the room's code** — §2's wrong hop named by learner and step (asserted), and the corrected ring equal to the sum (asserted).
# 3. **the parameter server** — §3's server bytes counted equal to 2·N·S for 1–4 learners (asserted), the step time measured beside them, and async staleness.
# 4. **stragglers and failures** — §4's straggler setting the step (asserted), a learner SIGKILLed mid-round named and the round discarded, the next round without them, and the returner healed from a live peer (asserted).
#
# **On a real cluster:** the room's store and Gloo authenticate nobody, so this runs only where every
# rank is on one machine you control; across machines a cluster's launcher, a private network and
# NCCL take their place, and a lost rank is found by heartbeats rather than by its process id.
#
# Back to the [table of contents](README.md).

# %%
room.close()
