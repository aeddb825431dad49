"""What came before what: execution order and data flow, read from the statistics alone.

msprobe records no edges and no clock across ranks; these rebuild both, for every diagnosis that looks for
an origin:

- :mod:`~precnb.analysis.causal.order`: the causal order of records within a (step, rank) and across ranks
  (collectives are the only synchronisation points), shared by the divergence and NaN-origin searches;
- :mod:`~precnb.analysis.causal.earliness`: how early each anomalous record comes in that order;
- :mod:`~precnb.analysis.causal.dataflow`: which captured op produced which input of one (step, rank);
- :mod:`~precnb.analysis.causal.coverage`: a bad value first seen in a tensor whose producer is not in the
  dump (a coverage gap), and how to capture it.

Nothing is imported here.
"""
