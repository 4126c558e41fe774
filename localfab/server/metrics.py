"""`/metrics`: every `llamacpp:` series llama-server exports, with its names, help texts and
meanings (tools/server/server-task.cpp, server_task_result_metrics::to_metrics)."""

from __future__ import annotations

from localfab.server.worker import Metrics

# Prometheus' text format, as llama-server labels it.
CONTENT_TYPE = "text/plain; version=0.0.4"


def _prom(value: float) -> str:
    # C++ ostream prints doubles with 6 significant digits and integers without a fraction.
    return f"{value:g}"


def render(m: Metrics, *, n_processing: int, n_deferred: int) -> str:
    """The exposition text; the caller resets the gauges' bucket after a scrape."""
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
            lines += [
                f"# HELP llamacpp:{name} {help_}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {_prom(value)}",
            ]
    return "\n".join(lines) + "\n"
