"""Reader for msprobe compare CSVs (placeholder until implemented)."""
def is_compare_csv(path) -> bool:
    return False
