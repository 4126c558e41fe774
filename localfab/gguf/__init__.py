"""GGUF model files: the header reader, hyperparameters, file checks and summaries."""
