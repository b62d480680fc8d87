"""A JupyterHub for a room of learners on one machine (``python -m lesson_lib workshop``).

``cli`` reads the command line; ``install`` puts the course once where every learner can read it;
``accounts`` makes a Unix user per learner and keeps the password hashed; ``serve`` runs the hub,
configured by ``hubconfig`` (the only module that imports jupyterhub, inside the hub's process);
``start`` runs as the learner and starts their JupyterLab on their own copy of the notebooks.
"""
