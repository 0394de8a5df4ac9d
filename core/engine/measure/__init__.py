"""What the engine measures and how it reports it: gradient and update probes (on the device, one transfer a
report), memory by kind, the step report, host and GPU telemetry (psutil, NVML), profiler snapshots and their tables,
and TensorBoard's files. The step's own stopwatch, which calls these, is ``engine/instruments.py``."""
