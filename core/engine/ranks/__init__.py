"""Training with more than one process: the supervisor that starts the ranks (torchrun's elastic agent) and starts
them again for a new world size or a rescue, the channel between rank 0 and the supervisor, and the OOM rescue's
rungs taken for every rank."""
