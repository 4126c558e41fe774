"""`python -m localfab` runs the command line."""

from __future__ import annotations

from localfab.cli import main

if __name__ == "__main__":
    main()
