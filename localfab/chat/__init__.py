"""The conversation layer: prompts from messages, chat sessions, context shift, continuation."""
