"""Processes and shards: a rank's place in its process group, the loopback rendezvous, FSDP2's sharding of the
model, the CPU cores a rank may use, and the signals that stop every rank at one boundary (preemption). What the
ranks do together is ``ranks``; what one rank trains, the engine's."""
