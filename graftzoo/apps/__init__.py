"""Applications on top of the core: the CLI, grid runner and demo."""
