"""A run: its typed config (config.py), its inputs checked and its directory made (prepare.py), its actors
built and fitted (wiring.py). The command line (cli/) builds the config from flags; benchmarks build it directly."""
