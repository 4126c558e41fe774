"""The model catalog, installed as the package `localfab._catalog` (see pyproject.toml).

This file makes the folder a regular package, which an editable install needs to map it into
`localfab`; the data is `catalog.toml`, read through `localfab.resources`.
"""
