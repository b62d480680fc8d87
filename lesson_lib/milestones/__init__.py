"""One module per milestone of the history, all the same shape (see lesson_lib.experiments)."""
