"""`/metrics`: every `llamacpp:` series llama-server exports, with its names, help texts and
meanings (tools/server/server-task.cpp, server_task_result_metrics::to_metrics)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from localfab.engine.prompt_cache import PromptCache
from localfab.engine.types import Done


@dataclass
class Metrics:
    """Counters behind /metrics, named after llama-server's `llamacpp:` series."""

    t_start: float = field(default_factory=time.time)
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0  # busy slots summed over llama_decode() calls
    n_tokens_max: int = 0
    draft_tokens_total: int = 0
    draft_accepted_total: int = 0
    draft_verifies_total: int = 0
    # Since the last scrape (llama-server's "bucket" gauges). Generation rates count decode
    # steps: the first token of a reply comes with the prompt's last batch, so it is left out.
    bucket_prompt_n: int = 0
    bucket_prompt_s: float = 0.0
    bucket_predicted_steps: int = 0
    bucket_predicted_s: float = 0.0

    def record(self, done: Done, n_batch: int, *, decodes: bool = True) -> None:
        """Count a finished reply; `decodes`: also the llama_decode calls it took, when one
        sequence decodes at a time (with parallel slots they are counted per step instead,
        `record_step`)."""
        t = done.timings
        steps = max(t.predicted_n - 1, 0)
        self.prompt_tokens_total += t.prompt_n
        self.prompt_tokens_cached_total += t.cache_n
        self.prompt_seconds_total += t.prompt_ms / 1e3
        self.tokens_predicted_total += t.predicted_n
        self.tokens_predicted_seconds_total += t.predicted_ms / 1e3
        if decodes:
            n_decode = -(-t.prompt_n // max(n_batch, 1)) + steps
            self.record_step(n_decode, n_decode)  # one sequence decodes at a time
        self.n_tokens_max = max(self.n_tokens_max, done.prompt_tokens + t.predicted_n)
        self.draft_tokens_total += t.draft_n
        self.draft_accepted_total += t.draft_n_accepted
        self.draft_verifies_total += t.draft_verifies
        self.bucket_prompt_n += t.prompt_n
        self.bucket_prompt_s += t.prompt_ms / 1e3
        self.bucket_predicted_steps += steps
        self.bucket_predicted_s += t.predicted_ms / 1e3

    def record_step(self, n_decode: int, n_busy: int) -> None:
        """`n_decode` llama_decode calls with `n_busy` busy slots summed over them."""
        self.n_decode_total += n_decode
        self.n_busy_slots_total += n_busy

    def reset_bucket(self) -> None:
        self.bucket_prompt_n = self.bucket_predicted_steps = 0
        self.bucket_prompt_s = self.bucket_predicted_s = 0.0


# Prometheus' text format, as llama-server labels it.
CONTENT_TYPE = "text/plain; version=0.0.4"


def _prom(value: float) -> str:
    # C++ ostream prints doubles with 6 significant digits and integers without a fraction.
    return f"{value:g}"


def render(
    m: Metrics, *, n_processing: int, n_deferred: int, cache: PromptCache | None = None
) -> str:
    """The exposition text; the caller resets the gauges' bucket after a scrape. The prompt
    cache's series are localfab's own (`localfab:`), after llama-server's."""
    counters = [
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
         m.prompt_tokens_total),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
         m.prompt_tokens_cached_total),
        ("prompt_seconds_total", "Total time spent processing prompts",
         m.prompt_seconds_total),
        ("tokens_predicted_total", "Number of generation tokens processed",
         m.tokens_predicted_total),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens",
         m.tokens_predicted_seconds_total),
        ("n_decode_total", "Total number of llama_decode() calls, excluding speculative "
         "decoding and multimodal decoding", m.n_decode_total),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)",
         m.n_tokens_max),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated",
         m.draft_tokens_total),
        ("spec_decode_num_accepted_tokens_total",
         "Speculative: Total draft tokens accepted by the target model", m.draft_accepted_total),
        ("spec_decode_num_drafts_total",
         "Speculative: Total speculative decoding verification steps", m.draft_verifies_total),
    ]  # fmt: skip
    gauges = [
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
         m.bucket_prompt_n / m.bucket_prompt_s if m.bucket_prompt_s else 0.0),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
         m.bucket_predicted_steps / m.bucket_predicted_s if m.bucket_predicted_s else 0.0),
        ("requests_processing", "Number of requests processing", n_processing),
        ("requests_deferred", "Number of requests deferred", n_deferred),
        ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         m.n_busy_slots_total / max(m.n_decode_total, 1)),
    ]  # fmt: skip
    lines = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, help_, value in items:
            lines += _series("llamacpp", name, help_, kind, value)
    if cache is not None and cache.enabled:
        for name, help_, kind, value in cache_series(cache):
            lines += _series("localfab", name, help_, kind, value)
    return "\n".join(lines) + "\n"


def _series(prefix: str, name: str, help_: str, kind: str, value: float) -> list[str]:
    return [
        f"# HELP {prefix}:{name} {help_}",
        f"# TYPE {prefix}:{name} {kind}",
        f"{prefix}:{name} {_prom(value)}",
    ]


def cache_series(cache: PromptCache) -> list[tuple[str, str, str, float]]:
    """The prompt cache's series: (name, help, kind, value)."""
    s = cache.stats
    return [
        ("prompt_cache_hits_total", "Kept prompt states restored into a slot", "counter", s.hits),
        ("prompt_cache_tokens_restored_total",
         "Prompt tokens restored from kept states instead of processed", "counter",
         s.tokens_restored),
        ("prompt_cache_saved_total", "Prompt states kept", "counter", s.saved),
        ("prompt_cache_evicted_total", "Kept prompt states dropped to stay within --cache-ram",
         "counter", s.evicted),
        ("prompt_cache_bytes", "Bytes of kept prompt states", "gauge", cache.nbytes),
        ("prompt_cache_prompts", "Prompt states kept", "gauge", len(cache.entries)),
        ("prompt_cache_disk_hits_total", "Of the hits, states read from --cache-disk's folder",
         "counter", s.disk_hits),
        ("prompt_cache_disk_written_total", "State files written to --cache-disk's folder",
         "counter", s.disk_written),
    ]  # fmt: skip
