"""What the line delivers: throughput, latency, long context and answer quality.

Owns: `tp4 bench decode|prefill` (throughput: the load generator and sparkDash's result file),
`tp4 report` and its charts (report, charts), `tp4 bench needle` (needle) and `tp4 qeval` (qeval).

May import: tp4.core, tp4.line, tp4.image, tp4.hosts, tp4.serving.
"""
