"""Will it fit: a step's memory predicted on fake tensors, before the memory is paid for (memory_forecast.py)."""
