"""The ``ds.prec`` accessor (filled in below)."""
