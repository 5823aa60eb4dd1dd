"""Checkpoints as the training frameworks write them: which files make one, which marker says it is
complete (``frameworks``), and the newest complete one under a prefix (``latest``)."""
