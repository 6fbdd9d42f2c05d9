"""Subcommands of the ``posenc`` command line, one module each (see ``posenc.cli``)."""
