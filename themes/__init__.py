"""The built-in themes, installed as the package `localfab._themes` (see pyproject.toml).

This file makes the folder a regular package, which an editable install needs to map it into
`localfab`; the data is the `*.toml` files, listed by `localfab.resources.builtin_theme_files`.
"""
