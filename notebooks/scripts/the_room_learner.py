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

# %% [markdown]
# # The room — your side
#
# Your instructor has opened a room on this server ([chapter 11](11_the_room.ipynb) is their
# notebook). Run the cell below with the room's name they gave you: your kernel becomes **one rank
# of the room's `torch.distributed` world**. The room's rounds run in a background thread of this
# kernel, so your code runs here, as you, and this notebook stays free while the room plays. If you
# are studying alone, open chapter 11 instead: it plays the room with learners of its own.

# %%
import torch

from lesson_lib import room

ROOM = "tuesday"  # the name your instructor gave
torch.set_num_threads(1)  # a room of kernels shares the server's cores

try:
    me = room.join(ROOM)
except FileNotFoundError as error:  # no room open under that name (yet): nothing else to do here
    me = None
    print(error)

# %% [markdown]
# ## The ring: your step
#
# Chapter 2's reduce-scatter, one step of it. At step `s` your rank sends one chunk to its right
# neighbour and adds what arrives from its left into another chunk. Return `(send_i, into_i)`: the
# chunk you send and the chunk you add into. The room does the sending and tells the instructor
# every partial sum you sent; if one is wrong, the room names the first wrong one, and it is yours
# only if everything you received was right. Your exceptions come back to you, printed here, and to
# the instructor with your name and line; they never stop the room.

# %%
def my_step(rank, n, s):
    send_i = (rank - s) % n      # the chunk that arrived at the last step (your own at step 0)
    into_i = (rank - s - 1) % n  # the chunk you will send at the next step
    return send_i, into_i


if me is not None:
    me.submit("ring", my_step)

# %% [markdown]
# ## The parameter server and the steps
#
# Nothing to write: in those rounds your kernel pulls the model's weights, computes a gradient on
# your share of the batch and pushes it (to the instructor's kernel, the server, or to the room's
# all-reduce). Run the next cell whenever you like to see what the room said to you so far.

# %%
if me is not None:
    print("\n".join(me.log))

# %% [markdown]
# When you are done: `me.leave()`, or just close the notebook (its kernel goes, and the room
# carries on without you, naming you).
