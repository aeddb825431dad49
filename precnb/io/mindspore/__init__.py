"""Readers of MindSpore's own kernel dumps (not msprobe's: those are read by :mod:`precnb.io.msprobe`).

- :mod:`~precnb.io.mindspore.statistic`: the ``statistic.csv`` layout (reader ``"kernel"``);
- :mod:`~precnb.io.mindspore.tensors`: one ``.npy`` per kernel input/output (reader ``"kernel_tensors"``);
- ``_layout``: the ``rank_<id>/<net>/<graph>/<iteration>/`` folder search both share; ``_stat_discover`` and
  ``_tensor_discover``: each layout's files grouped per (step, rank); ``_files``: ``.npy`` file names and
  statistics; ``_names``: scope names from the graph IR and the execution-order CSV.

Nothing is imported here: the readers are found through :mod:`precnb.io.readers`.
"""
