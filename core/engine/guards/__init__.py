"""The step's guardians: the OOM rescue (a step out of memory retried one rung down), the spike guard (a spike
skipped or rolled back), and the non-finite stop (a NaN or inf loss or gradient, and the batch that began it)."""
