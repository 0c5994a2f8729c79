"""One module per CLI subcommand; each has ``COMMAND`` (its arguments, from
:mod:`cpuprof.options_spec`) and ``run(args)``."""
