"""A run's checkpoint files: written whole or not at all, read back refusing what is not one, and what they hold
(the model, optimizer, schedule and data position, the live options). When to write one is the checkpointer's."""
