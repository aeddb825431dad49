"""Reader for msprobe monitor output (placeholder until implemented)."""
from pathlib import Path
def is_monitor_output(path) -> bool:
    return False
