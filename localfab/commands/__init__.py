"""Command-line commands, one module per area; each module exposes click commands.

Modules here import only click and light localfab modules at import time, so that
`localfab --help` stays instant; heavy imports (llama_cpp, textual) happen inside the commands.
"""
