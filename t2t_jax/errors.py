"""`UserError`: an error in what the user gave (a config field, an input file, a run directory),
reported by the launchers as one line without a traceback (`--debug` shows it), exit status 2."""


class UserError(Exception):
    """Bad input, named in the message; the launchers print it as one line and exit 2."""
