"""Launching a run: options, the child's environment and pinning, the parent and child processes."""
