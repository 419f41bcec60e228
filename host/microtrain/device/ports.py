"""Serial ports: which exist, and which one is the MicroPython board."""
from __future__ import annotations

from .errors import NoDevice

def usb_ids():
    """{(vid, pid): what} of the serial ports of MicroPython boards, from the board profiles
    (boards/*.json); boot loaders (DFU, UF2 drives, ROM download mode) are no REPL."""
    from ..boards import all_boards
    ids = {}
    for name, board in all_boards().items():
        for u in board["usb"]:
            if not any(w in u["what"].lower() for w in ("boot", "dfu")):
                ids.setdefault((int(u["vid"], 16), int(u["pid"], 16)), "%s, %s" % (name, u["what"]))
    return ids


def _known(p, ids):
    return None if p.vid is None else ids.get((p.vid, p.pid))


def describe_ports():
    """A short list of the serial ports that exist, for error messages."""
    import serial.tools.list_ports
    ports = sorted(serial.tools.list_ports.comports(), key=lambda p: p.device)
    if not ports:
        return "no serial ports found"
    return "ports here: " + ", ".join("%s (%04x:%04x %s)" % (p.device, p.vid, p.pid, p.description)
                                      if p.vid is not None else p.device for p in ports)


def find_board():
    """The one MicroPython board connected over USB, as mpremote's `connect auto` finds
    it, but by known USB ids. NoDevice when there is none or more than one."""
    import serial.tools.list_ports
    ids = usb_ids()
    found = [p for p in sorted(serial.tools.list_ports.comports(), key=lambda p: p.device) if _known(p, ids)]
    if len(found) == 1:
        return found[0].device
    if not found:
        raise NoDevice("no MicroPython board found over USB (%s); connect one or give --port" % describe_ports())
    raise NoDevice("%d MicroPython boards connected (%s); choose one with --port"
                   % (len(found), ", ".join("%s: %s" % (p.device, _known(p, ids)) for p in found)))
