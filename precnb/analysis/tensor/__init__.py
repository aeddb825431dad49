"""Whole-tensor analysis (``task="tensor"`` dumps), pure functions on arrays and datasets.

- :mod:`~precnb.analysis.tensor.metrics`: msprobe compare's tensor metrics for one pair of whole tensors;
- :mod:`~precnb.analysis.tensor.verdicts`: does a (step, rank, tensor) entry differ, judged on the whole tensor;
- :mod:`~precnb.analysis.tensor.findings`: what a divergence finding says about precision and tensor data.

Reading the tensor files is :mod:`precnb.io.tensors`' job; :func:`precnb.tensor_metrics` joins the two.
Nothing is imported here.
"""
