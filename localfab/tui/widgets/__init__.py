"""Widgets of the terminal app, by screen region."""
