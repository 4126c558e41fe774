"""Grammars for constrained sampling: GBNF from JSON schemas (`convert`, llama.cpp's converter)
and the checks that keep a grammar or schema from exhausting llama.cpp's parser (`limits`, with
its `bounds`, `nullables` and `schema_limits`). Pure Python but for `convert`'s import of
llama-cpp-python's converter."""
