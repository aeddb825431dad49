"""Reader for MindSpore kernel dumps (placeholder until implemented)."""
def is_kernel_dump(path) -> bool:
    return False
