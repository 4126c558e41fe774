"""Chatting with a model served elsewhere: a llama-server, a `localfab serve`, or any
OpenAI-compatible server (vLLM, SGLang, Ollama, LM Studio, a hosted API).

`client` speaks HTTP and turns every way a server can fail into one clear `RemoteError`;
`engine.RemoteEngine` drives a llama-server-like server token for token (its `/tokenize` and
`/completion`), so a chat session runs over it as over a model loaded here: the same template,
window, shift and continuation. Nothing here imports llama_cpp or textual.
"""
