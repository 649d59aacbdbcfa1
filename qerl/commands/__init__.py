"""The `qerl` subcommands, one module each (qerl/cli.py dispatches `qerl <name>` to commands/<name with dashes as
underscores>.py): `add_arguments(parser)` and `run(args)`, argument parsing and one call into the library, nothing
else. This is the top of the dependency chain: commands import the library, the library never imports a command
(tests/test_dependencies.py). `qerl train` (train.py) is the one that chains two stages: training, then the
evaluation of the trained policy in the same process.
"""
