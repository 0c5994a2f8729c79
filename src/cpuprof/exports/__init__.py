"""Files other tools read: folded stacks (flamegraph.pl, inferno), a self-contained SVG flame
graph, speedscope JSON and a Chrome/Perfetto trace. One module per format; each takes what
``analysis.flame`` (stacks) or the profile (trace) gives and writes one file."""
