"""Tools for the chat from MCP servers: their config, their processes and connections, and
their results as the model reads them. Only `connect` imports the `mcp` SDK."""
