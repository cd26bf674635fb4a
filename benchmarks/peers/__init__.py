"""The peers recjit is measured against, one module per framework. Each module's `PEERS` maps
a model name to a factory `make(forest, params) -> run`, where `run()` computes every root's
first state component for the whole batch and returns it as a NumPy array [num_roots, ...]."""
