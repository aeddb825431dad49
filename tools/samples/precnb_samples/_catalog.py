"""The bundled samples and the generator module of each.

Kept apart from :mod:`precnb_samples` so that the generator's modules read it without importing
the package that imports them.
"""

from __future__ import annotations

__all__ = ["CATALOG", "SAMPLE_NAMES"]

# name -> the generator module (``precnb_samples.<module>``) whose ``GENERATORS[name]`` writes it.
# A new scenario is one module with a ``GENERATORS`` dict plus one line here (generation order).
CATALOG: dict[str, str] = {
    "healthy": "_scenarios",
    "dp_nan": "_scenarios",
    "divergence": "_scenarios",
    "dp_sum": "_scenarios",
    "tp": "_scenarios",
    "monitor": "_scenarios",
    "renamed": "_scn_renamed",
    "pp_local": "_scn_pp",
    "tp_unsync": "_scn_tp_unsync",
    "xfw": "_scn_xfw",
    "kernel_resume": "_scn_kernel_resume",
    "preflight/healthy": "_scn_preflight",
    "preflight/frozen": "_scn_preflight",
    "preflight/extra_param": "_scn_preflight",
    "preflight/same_batch": "_scn_preflight",
    "preflight/lr10": "_scn_preflight",
    "preflight/packs": "_scn_preflight",
    "custom_op_gap": "_scn_diagnosis",
    "custom_op_registered": "_scn_diagnosis",
    "moe_empty_expert": "_scn_diagnosis",
    "moe_monitor": "_scn_diagnosis",
    "drift": "_scn_diagnosis",
    "tensor_bf16": "_scn_tensor",
    "tensor_bug": "_scn_tensor",
    # issues 28 (faulty device: replica departures followed to a host and device) and 29 (loss spikes)
    "sdc_clean": "_scn_sdc",
    "sdc": "_scn_sdc",
    "sdc_md5": "_scn_sdc",
    "sdc_rank": "_scn_sdc",
    "sdc_tensor": "_scn_sdc_tensor",
    "spike_healthy": "_scn_spike",
    "spike_data": "_scn_spike",
    "spike_optimizer": "_scn_spike",
    "spike_hardware": "_scn_spike",
    "spike_numerics": "_scn_spike",
    "spike_data_mask": "_scn_spike_mask",  # issue 47: a by-design -inf (causal mask) in a data spike
    # issue 26: per-rank metadata (call counters shift on one rank), a per-rank-seeded op under a TP merge
    "rank_shift": "_scn_rank_meta",
    "tp_noise": "_scn_rank_meta",
    # issue 24: real Megatron-Core runs (PRECNB_MEGATRON_PYTHON)
    "megatron": "_scn_megatron",
}

SAMPLE_NAMES: tuple[str, ...] = tuple(CATALOG)
"""Names of the samples (folders under the output directory), in generation order."""
