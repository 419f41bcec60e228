"""The .npz files the CLI reads (data sets, calibration samples, parameters), with an error
that names the option and what the file is instead, and the check of a path it writes. Below the
CLI and its subcommand modules (device/commands.py, fleet/commands.py), which all read them."""
import os

import numpy as np


def load_npz(path, option):
    """The arrays of an .npz archive, or ValueError saying what the file is instead."""
    try:
        d = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ValueError("%s %s: no such file" % (option, path)) from None
    except (OSError, ValueError, EOFError) as e:   # EOFError: an empty file
        raise ValueError("%s %s is not an .npz archive; write one with np.savez(%r, x=..., y=...)"
                         % (option, path, path)) from e
    if not hasattr(d, "files"):
        raise ValueError("%s %s is a single .npy array, not an .npz archive of named arrays; write one with "
                         "np.savez(%r, x=..., y=...)" % (option, path, os.path.splitext(path)[0] + ".npz"))
    return d


def load_data(path, option="--data"):
    d = load_npz(path, option)
    missing = [k for k in ("x", "y") if k not in d.files]
    if missing:
        raise ValueError("%s %s lacks array(s) %s; it must hold x (samples first) and y" % (option, path, missing))
    if ("x_test" in d.files) != ("y_test" in d.files):
        raise ValueError("%s %s holds %s without %s; give both or neither"
                         % ((option, path) + (("x_test", "y_test") if "x_test" in d.files else ("y_test", "x_test"))))
    return d


def writable(path, option):
    """Refuse an output path before any work is done for it."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise ValueError("cannot write %s %s: directory %s does not exist" % (option, path, d))
    if os.path.isdir(path):
        raise ValueError("cannot write %s %s: it is a directory" % (option, path))
    if not os.access(d, os.W_OK):
        raise ValueError("cannot write %s %s: directory %s is not writable" % (option, path, d))
