"""Small CLI subcommands that belong to no single stage."""
