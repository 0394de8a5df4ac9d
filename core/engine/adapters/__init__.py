"""A user's workload as the engine trains it: a factory's ``Workload`` loaded from its spec, and what a LightningModule
or a transformers ``Trainer`` becomes (their hooks run here, their optimizer and data loaders taken as they are)."""
