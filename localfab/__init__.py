"""localfab: run GGUF models well on small hardware."""

from __future__ import annotations

import logging

# A library logs; only the front ends decide what is shown.
logging.getLogger("localfab").addHandler(logging.NullHandler())

__version__ = "0.1.0"
