"""Tasks: the SWE-bench task model, loaders, the training pool's filters and the offline task factory."""
