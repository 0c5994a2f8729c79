"""The machine: topology, NUMA, OpenMP runtimes, libraries, and what can be measured here."""
