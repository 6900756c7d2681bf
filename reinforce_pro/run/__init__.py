"""A run: its typed config (config.py), read top to bottom in driver.py: its inputs checked and its directory
made, the built-in model warm-started (prepare.py, warm_start.py), its start-time settings fixed (start.py),
its actors built (actors.py), its rollout source and reward made (sources.py), then fitted, resumed from a
checkpoint where asked (resume.py) and after a lost actor (faults.py). The command line (cli/) builds the config
from flags; benchmarks build it directly."""
