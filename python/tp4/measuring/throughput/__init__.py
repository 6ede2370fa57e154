"""`tp4 bench`: an asyncio load generator over OpenAI-compatible streaming chat completions
(loadgen), the prompts it sends (prompts), the sparkDash-compatible result file (result) and the
runs of `tp4 bench decode` and `tp4 bench prefill` (run). docs/bench.md describes the method."""
