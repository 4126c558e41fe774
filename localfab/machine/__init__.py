"""The machine: device probes, GPU tables and types, power and energy readings."""
