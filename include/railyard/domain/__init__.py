"""The words and the rules: hosts and jobs, the config and its checks, recipes, windows, planning.
Imports nothing else of Railyard."""
