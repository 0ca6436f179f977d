"""The contract every layer shares: data types, the Learner protocol, the algorithm registry, the typed run config,
errors, metric names and run-directory file names. Nothing here imports torch at module level except ``batch``,
the update's tensors."""
