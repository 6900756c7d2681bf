"""A run: its typed config (config.py), read top to bottom in driver.py: its inputs checked and its directory
made (prepare.py), its actors built (wiring.py), then fitted. The command line (cli/) builds the config from
flags; benchmarks build it directly."""
