"""What can go wrong with a board, each a one-line message saying what to do."""


class DeviceError(Exception):
    """Base of everything here; the CLI prints str(e) on one line and exits with status 2."""


class NoDevice(DeviceError):
    """No board on the port, or none (or several) to choose from."""


class FirmwareError(DeviceError):
    """The board's firmware lacks the microtrain module, or reads another plan format."""


class PlanTooBig(DeviceError):
    """The plan needs more RAM than the board has free."""


class DataError(DeviceError):
    """Data that does not fit the plan's input or targets."""


class LinkError(DeviceError):
    """The board stopped answering, or every answer failed its checksum."""


class BoardReset(LinkError):
    """The board printed its banner or a REPL prompt: it was reset, or the server stopped."""


class BoardError(DeviceError):
    """The board answered a command with an error."""

    def __init__(self, kind, message):
        super().__init__("the board refused: %s: %s" % (kind, message))
        self.kind = kind
        self.message = message
