"""The room is the cluster: every learner's kernel one rank of one ``torch.distributed`` world, the
instructor's notebook its dashboard (``notebooks/11_the_room.ipynb``, docs/room.md).

Instructor::

    room = lesson_lib.room.open("tuesday")
    room.run("ring")            # one round: whoever has joined and is ready takes part
    room.close()

Learner::

    me = lesson_lib.room.join("tuesday")
    me.submit("ring", my_step)

Modules: ``place`` (the room's folder and store), ``rank`` (a round's world on one rank),
``learner``, ``instructor``, the activities ``ring``, ``server`` and ``steps``, ``rehearsal``
(learner processes of the notebook's own) and ``dashboard``.
"""

from .instructor import ACTIVITIES, Room, Round, open_room
from .learner import Learner, join
from .ring import reference_step

open = open_room

__all__ = ["ACTIVITIES", "Learner", "Room", "Round", "join", "open", "open_room", "reference_step"]
