# microtrain on the board: the C module `_microtrain` (Trainer, FORMAT_VERSION),
# built into the firmware or loaded from _microtrain.mpy, plus Python-level helpers.
# Users write `import microtrain; microtrain.Trainer(plan)`.
from _microtrain import *  # noqa: F401,F403


def serve():
    """Answer the host over the REPL's serial link until it quits (serve.py); the host
    starts this through the raw REPL. Imported on first use, so a board that never
    talks to a host never loads the server."""
    global serve
    from .serve import serve as run     # importing the submodule sets microtrain.serve to it...
    serve = run                         # ...so the name is bound to the function again, once
    run()
