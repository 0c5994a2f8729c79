"""One module per CLI subcommand; each has ``add_parser(subparsers)`` and ``run(args)``."""
